"""Attention over the KV cache: queries of the new tokens against every cached key.

On the GPU this is torch's fused SDPA. On the CPU, bf16/fp16 inputs are attended in fp32:
CPUs without half-precision units run torch's half-precision flash kernel several times
slower than the fp32 one (measured on AVX2: 697 us vs 164 us per layer at 1,000 cached
tokens), and the upcast copies are small next to that.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(
    q: torch.Tensor,  # [B, n_q, T, d]
    k: torch.Tensor,  # [B, n_kv, L, d]
    v: torch.Tensor,  # [B, n_kv, L, d]
    mask: torch.Tensor | None,  # [T, L] bool, True = may attend
    causal: bool,
) -> torch.Tensor:  # [B, n_q, T, d]
    if q.device.type == "cpu" and q.dtype != torch.float32:
        out = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal, enable_gqa=True
        )
        return out.to(q.dtype)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
    )
