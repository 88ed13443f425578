"""The verification kernel against its references on irregular shapes.

On a CPU machine the Triton kernel runs in Triton's interpreter (TRITON_INTERPRET=1, set in
conftest); on a GPU it runs compiled. Greedy results must be identical; sampled results
identical for the same random numbers.
"""

from __future__ import annotations

import pytest
import torch

from oracles.verify import verify_reference
from specgen.kernels import triton_available
from specgen.kernels.verify import verify_torch

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(batch, k, vocab, seed, *, sampled_q, agree=0.7):
    """Target logits and drafts that agree often enough to exercise long accepted runs."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, k + 1, vocab, generator=gen) * 3
    greedy_next = logits[:, :k].argmax(-1)
    random_tokens = torch.randint(0, vocab, (batch, k), generator=gen)
    keep = torch.rand(batch, k, generator=gen) < agree
    draft = torch.where(keep, greedy_next, random_tokens)
    probs = None
    if sampled_q:
        probs = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * 2, dim=-1)
    uniform = torch.rand(batch, k, generator=gen)
    noise = torch.empty(batch, vocab).exponential_(generator=gen)
    return [t.to(DEVICE) if t is not None else None for t in (logits, draft, probs, uniform, noise)]


CASES = [  # (batch, k, vocab)
    (1, 1, 49152),
    (2, 5, 49152),
    (1, 16, 49152),
    (3, 7, 151936),
    (1, 16, 151936),
    (4, 3, 1000),
]


@pytest.mark.parametrize("batch, k, vocab", CASES)
def test_greedy_kernel_is_identical(batch, k, vocab):
    from specgen.kernels.verify import verify_triton

    logits, draft, _, uniform, noise = _case(batch, k, vocab, seed=k * vocab, sampled_q=False)
    got = verify_triton(logits, draft, None, uniform, noise, 0.0)
    want = verify_torch(logits, draft, None, uniform, noise, 0.0)
    assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())


@pytest.mark.parametrize("batch, k, vocab", CASES)
@pytest.mark.parametrize("sampled_q", [False, True])
@pytest.mark.parametrize("temperature", [0.7, 1.0])
def test_sampling_kernel_is_identical_for_the_same_random_numbers(
    batch, k, vocab, sampled_q, temperature
):
    from specgen.kernels.verify import verify_triton

    logits, draft, probs, uniform, noise = _case(
        batch, k, vocab, seed=vocab + k, sampled_q=sampled_q, agree=0.9
    )
    got = verify_triton(logits, draft, probs, uniform, noise, temperature)
    want = verify_torch(logits, draft, probs, uniform, noise, temperature)
    assert got[0].tolist() == want[0].tolist()
    assert got[1].tolist() == want[1].tolist()


@pytest.mark.parametrize("batch, k, vocab", [(3, 4, 50), (2, 1, 7), (5, 6, 300)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
@pytest.mark.parametrize("sampled_q", [False, True])
def test_vectorised_reference_matches_the_slow_one(batch, k, vocab, temperature, sampled_q):
    for seed in range(20):
        args = _case(batch, k, vocab, seed=seed, sampled_q=sampled_q, agree=0.8)
        args = [a.cpu() if a is not None else None for a in args]
        accepted, token = verify_torch(*args, temperature)
        assert (accepted.tolist(), token.tolist()) == verify_reference(*args, temperature)


def test_masked_logits_are_never_produced():
    """Entries filtered to -inf (top-k/top-p) have p = 0: never accepted, never sampled."""
    from specgen.kernels.verify import verify_triton

    logits, draft, _, uniform, noise = _case(2, 4, 500, seed=3, sampled_q=False, agree=1.0)
    masked = logits.clone()
    masked[:, :, :250] = float("-inf")
    draft = torch.full_like(draft, 7)  # inside the masked range
    for fn in (verify_torch, verify_triton):
        accepted, token = fn(masked, draft, None, uniform, noise, 1.0)
        assert accepted.tolist() == [0, 0] and all(t >= 250 for t in token.tolist())
