"""Verification: which draft tokens the target accepts, and the one token it adds.

Vocabulary (used in code, stats and docs):
- target: the model whose output we must reproduce; p is ITS distribution (after
  temperature, top-k and top-p). drafter: the cheap proposer; q is ITS distribution.
- anchor: the last committed token; the block verified is [anchor, d1..dk].
- accepted: the leading draft tokens the target agrees with.
- bonus: the token the target itself adds after them - at the first rejection (a
  "recovered" token drawn from normalize(max(p - q, 0))) or after all k were accepted
  (drawn from p). Every step therefore commits accepted + 1 tokens.

Greedy (temperature 0): d_i is accepted iff it equals argmax of the target's logits, and
the bonus is that argmax, so output equals plain greedy decoding token for token.
Sampling: standard speculative rejection sampling (accept d_i with probability
min(1, p(d_i) / q(d_i)); a point-mass drafter has q(d_i) = 1), which makes the committed
tokens distributed exactly as the target's own sampling (Leviathan et al. 2023; Chen et
al. 2023). The random numbers come from the request's seeded generator, so a seeded run is
reproducible; the arithmetic is in `kernels/verify.py`, its slow per-position reference
in `tests/oracles/verify.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft
from specgen.kernels.verify import verify
from specgen.verify.sampling import filter_logits


@dataclass(frozen=True)
class Verdict:
    accepted: torch.Tensor  # [B] int64: leading draft tokens accepted
    bonus: torch.Tensor  # [B] int64: the target's own next token


def draw_random(
    batch: int, k: int, vocab: int, generator: torch.Generator, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's random numbers: uniforms for the k acceptance tests, Exp(1) for the race."""
    uniform = torch.rand(batch, k, generator=generator, device=device)
    noise = torch.empty(batch, vocab, device=device).exponential_(generator=generator)
    return uniform, noise


def verify_draft(
    logits: torch.Tensor,  # [B, k+1, V]: target logits for [anchor, d1..dk]
    draft: Draft,
    params: SamplingParams,
    generator: torch.Generator,
) -> Verdict:
    bsz, k = draft.tokens.shape
    if params.greedy:
        empty = logits.new_empty(bsz, 0)
        accepted, bonus = verify(logits, draft.tokens, None, empty, empty, 0.0)
        return Verdict(accepted, bonus)
    filtered = filter_logits(logits, params)  # -inf outside top-k/top-p: p is 0 there
    uniform, noise = draw_random(bsz, k, logits.shape[-1], generator, logits.device)
    accepted, bonus = verify(
        filtered, draft.tokens, draft.probs, uniform, noise, params.temperature
    )
    return Verdict(accepted, bonus)
