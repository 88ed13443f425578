"""Logits -> next token: greedy, or temperature / top-k / top-p sampling.

`probabilities` is the one place the sampling filters are applied, so the AR baseline and
(later) the speculative verifier sample from exactly the same distribution.
"""

from __future__ import annotations

import os

import torch

from specgen.core.config import SamplingParams
from specgen.kernels.verify import greedy


def make_generator(params: SamplingParams, device: torch.device) -> torch.Generator:
    """A private RNG: seeded runs are reproducible and never disturb torch's global RNG."""
    seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
    return torch.Generator(device=device).manual_seed(seed)


def filter_logits(
    logits: torch.Tensor,  # [..., V]
    params: SamplingParams,
) -> torch.Tensor:  # [..., V] fp32; filtered-out entries are -inf
    """Apply top-k and top-p (on the temperature-scaled distribution), transformers' order."""
    logits = logits.float()
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = (sorted_logits / params.temperature).softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p; the most
        # likely token always survives.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop = mass_before >= params.top_p
        drop[..., 0] = False
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return logits


def probabilities(
    logits: torch.Tensor,  # [..., V]
    params: SamplingParams,
) -> torch.Tensor:  # [..., V] fp32, rows sum to 1
    """The distribution the target samples from: softmax(filtered logits / T)."""
    return (filter_logits(logits, params) / params.temperature).softmax(dim=-1)


def sample(
    logits: torch.Tensor,  # [B, V]
    params: SamplingParams,
    generator: torch.Generator,
) -> torch.Tensor:  # [B] int64
    if params.greedy:
        return greedy(logits)
    probs = probabilities(logits, params)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
