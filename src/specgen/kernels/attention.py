"""Attention over the KV cache: queries of the new tokens against every cached key.

On the GPU this is torch's fused SDPA, with cuDNN's backend left out: it builds an
execution plan for each new key length, so decoding (the cache grows every step) paid
host time per layer per step for it (benchmarks/profile_eager_steps.py; docs/results.md);
the flash and memory-efficient kernels have no such setup. On the CPU, bf16/fp16 inputs
are attended in fp32 (fp64 ones, the tests' oracles, stay fp64): CPUs without
half-precision units run torch's half-precision flash kernel several times slower than the
fp32 one, and the upcast copies are small next to that.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

CUDA_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def attention(
    q: torch.Tensor,  # [B, n_q, T, d]
    k: torch.Tensor,  # [B, n_kv, L, d]
    v: torch.Tensor,  # [B, n_kv, L, d]
    mask: torch.Tensor | None,  # [T, L] bool, True = may attend
    causal: bool,
    scale: float | None = None,  # of the scores; None: 1/sqrt(d) (Gemma 4: 1, q/k are normed)
) -> torch.Tensor:  # [B, n_q, T, d]
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal, enable_gqa=True,
            scale=scale,
        )  # fmt: skip
        return out.to(q.dtype)
    backends = sdpa_kernel(CUDA_BACKENDS) if q.is_cuda else contextlib.nullcontext()
    with backends:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=scale
        )
