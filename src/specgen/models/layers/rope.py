"""Rotary position embeddings, in the HF "rotate half" layout.

Tables are computed in fp32 exactly as transformers does (inv_freq outer positions, then
cos/sin) and cast to the model dtype once, so fp32 logits match transformers bit for bit
in the rotary part.
"""

from __future__ import annotations

import math

import torch

from specgen.core.config import RopeArgs


def inv_frequencies(rope: RopeArgs, head_dim: int) -> torch.Tensor:  # [d/2] fp32
    inv_freq = 1.0 / (
        rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    )
    if rope.kind == "linear":
        return inv_freq / rope.factor
    if rope.kind == "proportional":  # Gemma 4: the first share turns, the rest stand still
        turning = int(rope.partial * head_dim // 2)
        inv_freq[turning:] = 0.0
        return inv_freq / rope.factor
    if rope.kind == "llama3":
        return _llama3_scale(inv_freq, rope)
    return inv_freq


def _llama3_scale(inv_freq: torch.Tensor, rope: RopeArgs) -> torch.Tensor:
    # Llama 3.1: long wavelengths are slowed by `factor`, short ones kept, and the band in
    # between interpolated smoothly.
    low_wavelen = rope.original_max_positions / rope.low_freq_factor
    high_wavelen = rope.original_max_positions / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (rope.original_max_positions / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_tables(
    rope: RopeArgs, head_dim: int, length: int, *, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:  # cos, sin: [length, d]
    inv_freq = inv_frequencies(rope, head_dim).to(device)
    positions = torch.arange(length, device=device, dtype=torch.float32)
    freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
