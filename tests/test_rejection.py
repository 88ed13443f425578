"""Speculative rejection sampling is exact: a statistical test in the style of vLLM's.

A synthetic target and drafter are bigram models over a small vocabulary, so the exact
distribution of the n-th generated token is a matrix power. Many sequences are generated
in parallel through the real verifier (`verify_draft`: filtering, random numbers, kernel
dispatch) and the empirical marginals must converge to the exact ones: the total
variation distance shrinks as samples grow and ends far below that of random distributions.
"""

from __future__ import annotations

import pytest
import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft
from specgen.verify import verify_draft
from specgen.verify.sampling import probabilities

VOCAB = 6
DEPTH = 3  # compare the marginals of the first three generated tokens


def _models(seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randn(VOCAB, VOCAB, generator=gen) * 2  # logits of x_next | x_prev
    drafter = torch.randn(VOCAB, VOCAB, generator=gen) * 2
    return target, drafter


def _generate(target, drafter, params, k, sampled_draft, n, seed):
    """n sequences from token 0, speculatively; returns [n, DEPTH] generated tokens."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.arange(n)
    out = torch.full((n, DEPTH + k + 1), -1, dtype=torch.long)
    length = torch.zeros(n, dtype=torch.long)
    anchor = torch.zeros(n, dtype=torch.long)
    while int(length.min()) < DEPTH:
        tokens, probs, prev = [], [], anchor
        for _ in range(k):
            q = torch.softmax(drafter[prev], dim=-1)
            d = (
                torch.multinomial(q, 1, generator=gen).squeeze(-1)
                if sampled_draft
                else q.argmax(-1)
            )
            tokens.append(d)
            probs.append(q)
            prev = d
        draft_tokens = torch.stack(tokens, 1)
        draft = Draft(draft_tokens, torch.stack(probs, 1) if sampled_draft else None)
        context = torch.cat([anchor[:, None], draft_tokens], 1)  # [n, k+1]
        verdict = verify_draft(target[context], draft, params, gen)
        committed = torch.cat([draft_tokens, verdict.bonus[:, None]], 1)
        committed[rows, verdict.accepted] = verdict.bonus
        for j in range(k + 1):
            take = (j <= verdict.accepted) & (length + j < out.shape[1])
            out[rows[take], (length + j)[take]] = committed[take, j]
        length += verdict.accepted + 1
        anchor = verdict.bonus
    return out[:, :DEPTH]


def _exact_marginals(target, params):
    transition = probabilities(target, params)  # rows: the filtered target distribution
    state = torch.zeros(VOCAB)
    state[0] = 1.0
    marginals = []
    for _ in range(DEPTH):
        state = state @ transition
        marginals.append(state)
    return torch.stack(marginals)  # [DEPTH, V]


def _tv(samples, exact):
    counts = torch.stack([torch.bincount(samples[:, i], minlength=VOCAB) for i in range(DEPTH)])
    empirical = counts.float() / samples.shape[0]
    return 0.5 * (empirical - exact).abs().sum(-1).max().item()


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
]


@pytest.mark.parametrize("params", PARAMS, ids=["plain", "top-k", "top-p"])
@pytest.mark.parametrize("sampled_draft", [True, False], ids=["sampled-q", "point-mass"])
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_output_distribution_converges_to_the_target(params, sampled_draft, k):
    target, drafter = _models(seed=k)
    exact = _exact_marginals(target, params)
    few = _tv(_generate(target, drafter, params, k, sampled_draft, 1_000, seed=1), exact)
    many = _tv(_generate(target, drafter, params, k, sampled_draft, 40_000, seed=2), exact)
    random_refs = torch.distributions.Dirichlet(torch.ones(VOCAB)).sample((100,))
    far = 0.5 * (random_refs - exact[0]).abs().sum(-1).mean().item()
    assert many < 0.02, many
    assert many < few / 2, (few, many)  # it converges as samples grow
    assert many < far / 10, (many, far)  # and is nowhere near a random distribution


@pytest.mark.parametrize("k", [1, 3])
def test_greedy_speculation_reproduces_greedy_decoding(k):
    target, drafter = _models(seed=10 + k)
    out = _generate(target, drafter, SamplingParams(), k, False, 4, seed=0)
    expected, token = [], 0
    for _ in range(DEPTH):
        token = int(target[token].argmax())
        expected.append(token)
    assert out.tolist() == [expected] * 4


def test_seeded_verification_is_reproducible():
    target, drafter = _models(seed=5)
    params = SamplingParams(temperature=1.0)
    a = _generate(target, drafter, params, 3, True, 200, seed=9)
    b = _generate(target, drafter, params, 3, True, 200, seed=9)
    assert torch.equal(a, b)
