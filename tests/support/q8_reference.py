"""The reference of the 8-bit-activation products (kernels/cpu/packed.h, SPECGEN_CPU_ACT=q8).

Each row of x is quantized per block of 32 columns as the kernels do it (q = round(x * 127 /
amax), ties to even; d = amax / 127; a block under 2^-100 is zero, one holding a NaN or an
infinity gets d = NaN and q = 0). The product is then the dequantized matrix times the
dequantized rows, computed exactly (float64: every term is an exact product of an integer
and one or two fp32 values), and the kernels' fp32 chain must land within `bound` of it.
"""

from __future__ import annotations

import torch

TINY = 2.0**-100


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # q [M, K], d [M, K/32]
    rows, k = x.shape
    b = x.float().reshape(rows, k // 32, 32)
    amax = b.abs().amax(-1)
    finite = torch.isfinite(b).all(-1)
    zero = (amax < TINY) | ~finite
    safe = torch.where(zero, torch.ones_like(amax), amax)
    inv = torch.where(zero, torch.zeros_like(amax), torch.tensor(127.0) / safe)
    d = torch.where(zero, torch.zeros_like(amax), safe / 127.0)
    d = torch.where(finite, d, torch.full_like(d, float("nan")))
    q = torch.round((b * inv[..., None]).clamp(-127, 127))
    q = torch.where(finite[..., None], q, torch.zeros_like(q)).to(torch.int8)
    return q.reshape(rows, k), d


def q8_product(x: torch.Tensor, m) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact product (float64 [M, N]) of `m`'s dequantized matrix with x's rows as the
    kernels quantize them, and the bound on an fp32 chain's distance from it: per output,
    one rounding of each scale product and of each step of the chain of K / min(group, 32)
    block terms and K / group offsets (their X sums' roundings too)."""
    rows, k = x.shape
    if m.columns is not None:
        x = x[:, m.columns]  # the kernels gather their input first
    q, d = quantize_rows(x)
    xh = (q.double().view(rows, k // 32, 32) * d.double()[..., None]).view(rows, k)
    g = m.group
    ws = m.integers().double() * m.scale.double().repeat_interleave(g, 1)
    exact, size = xh @ ws.T, xh.abs() @ ws.abs().T
    steps = k // min(g, 32)
    if m.mins is not None:
        sums, mins = xh.view(rows, k // g, g).sum(-1), m.mins.double()
        exact = exact + sums @ mins.T
        size = size + xh.abs().view(rows, k // g, g).sum(-1) @ mins.abs().T * (g // 32 + 1)
        steps += k // g
    return exact, (steps + 2) * 2.0**-24 * size * 1.01 + 1e-30
