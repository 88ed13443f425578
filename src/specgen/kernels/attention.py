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
# Up to this many queries on the CPU (decode steps, verify blocks, short chunks), each row
# is attended alone over exactly the keys it sees: torch's CPU attention gave a row of a
# block other bits than the same row decoded alone (on an AMD EPYC: 1e-6 to 1e-5, enough to
# flip an 8-bit activation and a near-tie greedy pick), so a verify row would not be a
# decode step. Longer prompt chunks keep one call: no decode step is held to their rows.
ROWS_ALONE = 64


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
    if (
        q.device.type == "cpu"
        and q.shape[2] <= ROWS_ALONE
        and q.shape[0] == 1
        and (causal or (mask is not None and mask.dim() == 2))
    ):
        return _rows_alone(q, k, v, mask, causal, scale)
    backends = sdpa_kernel(CUDA_BACKENDS) if q.is_cuda else contextlib.nullcontext()
    with backends:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=scale
        )


def _rows_alone(q, k, v, mask, causal, scale):
    """Each query row alone over the keys it sees, [a, b), with no mask: a row's arithmetic
    is then the same whatever rows share the call (a decode step is one)."""
    ranges = _key_ranges(mask, k.shape[2], q.shape[2], causal)
    if ranges is None:  # some row's keys are not one range: one masked call
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True, scale=scale
        )
    rows = [
        F.scaled_dot_product_attention(q[:, :, t : t + 1], k[:, :, a:b], v[:, :, a:b],
                                       enable_gqa=True, scale=scale)
        for t, (a, b) in enumerate(ranges)
    ]  # fmt: skip
    return torch.cat(rows, 2)


def _key_ranges(mask, length: int, rows: int, causal: bool) -> list[tuple[int, int]] | None:
    """Each query row's visible keys as [a, b) of `length` (a mask covers the last
    mask.shape[-1] of them), or None where some row sees none or not one run of keys."""
    if mask is None:
        return [(0, length - rows + t + 1 if causal else length) for t in range(rows)]
    width, seen = mask.shape[-1], mask.to(torch.int32)
    count = seen.sum(-1)
    first = seen.argmax(-1)  # the first visible key
    last = width - 1 - seen.flip(-1).argmax(-1)  # the last
    if bool(((count == 0) | (last - first + 1 != count)).any()):
        return None
    offset = length - width
    return list(zip((first + offset).tolist(), (last + 1 + offset).tolist(), strict=True))
