"""Sampling: transformers' filters, seeded reproducibility, and the right distribution."""

from __future__ import annotations

import pytest
import torch

from specgen.core.config import SamplingParams
from specgen.verify.sampling import make_generator, probabilities, sample


def _transformers_probs(logits, params):
    from transformers.generation.logits_process import (
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = TemperatureLogitsWarper(params.temperature)(None, logits.clone())
    if params.top_k:
        scores = TopKLogitsWarper(params.top_k)(None, scores)
    if params.top_p < 1:
        scores = TopPLogitsWarper(params.top_p)(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1.3, top_p=0.9),
        SamplingParams(temperature=0.8, top_k=50, top_p=0.5),
        SamplingParams(temperature=1.0, top_p=0.01),  # only the argmax survives
    ],
)
def test_filters_match_transformers(params):
    logits = torch.randn(3, 257, generator=torch.Generator().manual_seed(0)) * 3
    ours = probabilities(logits, params)
    torch.testing.assert_close(ours, _transformers_probs(logits, params), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(ours.sum(-1), torch.ones(3))


def test_greedy_is_argmax():
    logits = torch.randn(4, 100)
    gen = make_generator(SamplingParams(), torch.device("cpu"))
    assert torch.equal(sample(logits, SamplingParams(), gen), logits.argmax(-1))


def test_greedy_takes_torchs_first_maximum_and_nans_as_torch_does():
    """numpy's argmax on the CPU (kernels.verify.greedy) picks what torch's would: the first
    of tied maxima, the first NaN over any number, and an all -inf row's first index."""
    from specgen.kernels.verify import greedy

    nan, inf = float("nan"), float("inf")
    rows = torch.tensor([[1.0, 3.0, 3.0, 2.0], [1.0, nan, 5.0, nan], [-inf] * 4,
                         [inf, 1.0, inf, 0.0], [-inf, -1.0, -inf, -1.0]])  # fmt: skip
    blocks = torch.randn(2, 5, 49152)
    blocks[0, 1, 7] = blocks[0, 1, 9] = blocks[0, 1].max() + 1
    for x in (rows, blocks, blocks[:, 1:3], blocks.transpose(0, 1), rows[0]):
        got = greedy(x)
        assert got.dtype == torch.int64 and torch.equal(got, x.argmax(dim=-1))
    assert torch.equal(greedy(rows.double()), rows.argmax(dim=-1))  # (torch's own)


def test_seeded_sampling_is_reproducible():
    logits = torch.zeros(1, 1000)
    params = SamplingParams(temperature=1.0, seed=42)

    def draw(p):
        gen = make_generator(p, torch.device("cpu"))
        return [int(sample(logits, p, gen)) for _ in range(20)]

    assert draw(params) == draw(params)
    assert draw(params) != draw(SamplingParams(temperature=1.0, seed=43))


def test_samples_follow_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    params = SamplingParams(temperature=0.9, top_k=4, seed=0)
    gen = make_generator(params, torch.device("cpu"))
    draws = torch.stack([sample(logits, params, gen) for _ in range(20000)])
    empirical = torch.bincount(draws.flatten(), minlength=6).float() / draws.numel()
    expected = probabilities(logits, params)[0]
    assert empirical[4:].sum() == 0  # outside the top-k: never drawn
    assert 0.5 * (empirical - expected).abs().sum() < 0.02  # total variation distance
