"""RMSNorm, optionally fused with the residual add before it (Qwen3/Llama layers).

    h   = x + residual            (when a residual is given; h is returned for the next add)
    out = weight * (h / sqrt(mean(h^2) + eps))

Rounding follows transformers (`rms_norm`): statistics in fp32; in bf16/fp16 the
normalised row is rounded to the input dtype before the weight multiplies it, and the
residual sum is rounded to the input dtype (as an eager `x + residual` would be).

The Triton kernel does one row per program: one read of x (and the residual), one write
of h and of the output, instead of eager torch's three to five passes over the row. Used
on CUDA when the kernel backend is Triton; tested on the CPU under TRITON_INTERPRET=1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.kernels import backend, triton_wanted


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm as transformers rounds it: in fp32 the fused `F.rms_norm` (same maths); in
    bf16/fp16 normalised in fp32, rounded to the model dtype, then multiplied by the weight,
    so reduced-precision logits stay as close to transformers' as possible. An fp32 weight
    with bf16/fp16 input (Qwen3.5's zero-centred norms) scales in fp32 and rounds once."""
    if x.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dtype == torch.float32:  # zero-centred norms (Qwen3.5): scaled, then rounded
        return (xf * weight).to(x.dtype)
    return weight * xf.to(x.dtype)


def rms_norm_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (normed, h = x + residual or x)
    h = x if residual is None else x + residual
    return rms_norm(h, weight, eps), h


def add_rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dispatch: the Triton kernel on CUDA with the Triton backend, else torch."""
    if x.is_cuda and backend() == "triton":
        return rms_norm_triton(x, weight, eps, residual)
    return rms_norm_torch(x, weight, eps, residual)


if triton_wanted():
    import triton
    import triton.language as tl

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        res_ptr,
        w_ptr,
        out_ptr,
        h_ptr,
        H,
        eps,
        HAS_RESIDUAL: tl.constexpr,
        ROUND_BEFORE_WEIGHT: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + row * H + cols, mask=mask, other=0.0)
            # torch adds bf16/fp16 in fp32 and rounds once: the same here
            x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
            tl.store(h_ptr + row * H + cols, x, mask=mask)
        xf = x.to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / H + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0)
        if ROUND_BEFORE_WEIGHT:  # bf16/fp16: transformers rounds, then multiplies
            # (a bf16 product is an fp32 product rounded once, as torch computes it)
            y = w.to(tl.float32) * (xf * inv).to(x.dtype).to(tl.float32)
        else:
            y = (xf * inv) * w.to(tl.float32)
        tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=mask)

    def rms_norm_triton(
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape, h_size = x.shape, x.shape[-1]
        x2 = x.reshape(-1, h_size).contiguous()
        res = None if residual is None else residual.reshape(-1, h_size).contiguous()
        out = torch.empty_like(x2)
        h = x2 if res is None else torch.empty_like(x2)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            x2 if res is None else res,
            weight,
            out,
            h,
            h_size,
            eps,
            HAS_RESIDUAL=res is not None,
            ROUND_BEFORE_WEIGHT=x.dtype != torch.float32 and weight.dtype != torch.float32,
            BLOCK=triton.next_power_of_2(h_size),
        )
        return out.view(shape), h.view(shape)
