"""Qwen3's per-head q/k RMSNorm followed by RoPE, fused.

    q_h <- rope(rms_norm(q_h) * q_norm_weight)   for every query head
    k_h <- rope(rms_norm(k_h) * k_norm_weight)   for every key head

with rope(y)[i] = y[i] cos[i] + rotate_half(y)[i] sin[i] (HF's "rotate half" layout). The
input is the q and k heads side by side ([B, T, nq + nkv, d]), as the layer lays them out
to rotate them with one set of ops. Eager torch makes five passes over these heads (two
norms, a concat, two rope products); the kernel reads each head once and writes it once.
Statistics and the rotation are computed in fp32 and rounded once at the end, so in
bf16/fp16 results can differ from eager torch's (which rounds after every op) by an ulp.
"""

from __future__ import annotations

import torch

from specgen.kernels import backend, triton_wanted
from specgen.kernels.rmsnorm import rms_norm


def apply_rope(
    x: torch.Tensor,  # [B, T, H, d]
    cos: torch.Tensor,  # [T, d]
    sin: torch.Tensor,  # [T, d]
) -> torch.Tensor:
    """Rotary position embedding in HF's "rotate half" layout (tables: models/layers/rope.py)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def qk_norm_rope_torch(
    qk: torch.Tensor,  # [B, T, nq + nkv, d]
    nq: int,
    q_weight: torch.Tensor,  # [d]
    k_weight: torch.Tensor,  # [d]
    cos: torch.Tensor,  # [T, d]
    sin: torch.Tensor,  # [T, d]
    eps: float,
) -> torch.Tensor:
    q = rms_norm(qk[:, :, :nq], q_weight, eps)
    k = rms_norm(qk[:, :, nq:], k_weight, eps)
    return apply_rope(torch.cat((q, k), dim=2), cos, sin)


def qk_norm_rope(qk, nq, q_weight, k_weight, cos, sin, eps) -> torch.Tensor:
    """Dispatch: the Triton kernel on CUDA with the Triton backend, else torch."""
    d = qk.shape[-1]
    if qk.is_cuda and backend() == "triton" and d >= 4 and d & (d - 1) == 0:
        return qk_norm_rope_triton(qk, nq, q_weight, k_weight, cos, sin, eps)
    return qk_norm_rope_torch(qk, nq, q_weight, k_weight, cos, sin, eps)


if triton_wanted():
    import triton
    import triton.language as tl

    @triton.jit
    def _qk_norm_rope_kernel(
        qk_ptr,
        out_ptr,
        qw_ptr,
        kw_ptr,
        cos_ptr,
        sin_ptr,
        T,
        NH,
        NQ,
        eps,
        D: tl.constexpr,
    ):
        row = tl.program_id(0)  # one head of one token: row = (b * T + t) * NH + head
        head = row % NH
        t = (row // NH) % T
        half: tl.constexpr = D // 2
        lo = tl.arange(0, half)
        base = qk_ptr + row * D
        x1 = tl.load(base + lo).to(tl.float32)
        x2 = tl.load(base + half + lo).to(tl.float32)
        inv = 1.0 / tl.sqrt((tl.sum(x1 * x1, axis=0) + tl.sum(x2 * x2, axis=0)) / D + eps)
        is_q = head < NQ
        w1 = tl.where(is_q, tl.load(qw_ptr + lo), tl.load(kw_ptr + lo)).to(tl.float32)
        w2 = tl.where(is_q, tl.load(qw_ptr + half + lo), tl.load(kw_ptr + half + lo))
        y1 = x1 * inv * w1
        y2 = x2 * inv * w2.to(tl.float32)
        c1 = tl.load(cos_ptr + t * D + lo).to(tl.float32)
        c2 = tl.load(cos_ptr + t * D + half + lo).to(tl.float32)
        s1 = tl.load(sin_ptr + t * D + lo).to(tl.float32)
        s2 = tl.load(sin_ptr + t * D + half + lo).to(tl.float32)
        dtype = out_ptr.dtype.element_ty
        tl.store(out_ptr + row * D + lo, (y1 * c1 - y2 * s1).to(dtype))
        tl.store(out_ptr + row * D + half + lo, (y2 * c2 + y1 * s2).to(dtype))

    def qk_norm_rope_triton(qk, nq, q_weight, k_weight, cos, sin, eps) -> torch.Tensor:
        b, t, nh, d = qk.shape
        x = qk.contiguous()
        out = torch.empty_like(x)
        _qk_norm_rope_kernel[(b * t * nh,)](
            x, out, q_weight, k_weight, cos.contiguous(), sin.contiguous(), t, nh, nq, eps, D=d
        )
        return out
