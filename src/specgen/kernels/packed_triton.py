"""y = x W^T for a packed W on CUDA: one Triton kernel for decode rows and verify blocks.

Each program takes a tile of BLOCK_N output columns by BLOCK_M rows and walks K in
BLOCK_K steps: it loads the tile's 4- or 8-bit integers, dequantizes them in registers
exactly as `PackedMatrix.dequantize` does (w = s q + m in fp32, one rounding), and
multiplies: fp32 with IEEE products (the file's own model); bf16/fp16 with w rounded to
that dtype (the dequantized model at that dtype) on tf32 tensor cores, where bf16 and fp16
values are exact, so the products are a bf16 MMA's. Accumulation is fp32 either way.

BLOCK_M is fixed whatever M is, and K is walked in one order with no split-K or atomics,
so a row's result never depends on the rows beside it: a verify block equals its decode
steps. Tested under TRITON_INTERPRET=1 against the torch reference
(tests/kernels/test_packed_triton.py).
"""

from __future__ import annotations

import torch

from specgen.kernels import triton_wanted

BLOCK_M = 16  # rows per program: fixed, so results do not depend on M
BLOCK_N = 64
BLOCK_K = 64


def packed_linear_triton(x: torch.Tensor, m) -> torch.Tensor:
    import triton

    n, k = m.shape
    if m.columns is not None:  # columns stored in another order: the inputs follow them
        x = x.index_select(-1, m.columns)
    flat = x.reshape(-1, k).contiguous()
    rows = flat.shape[0]
    y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    mins = m.mins if m.mins is not None else m.scale  # unread when HAS_MINS is false
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(rows, BLOCK_M))
    _packed_kernel[grid](
        flat, m.q, m.scale, mins, y, rows, n, k, m.group,
        BITS=m.bits, HAS_MINS=m.mins is not None, IEEE=x.dtype == torch.float32,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
    )  # fmt: skip
    return y.view(*x.shape[:-1], n)


if triton_wanted():
    import triton
    import triton.language as tl

    @triton.jit
    def _packed_kernel(
        x_ptr, q_ptr, s_ptr, m_ptr, y_ptr, M, N, K, GROUP,
        BITS: tl.constexpr, HAS_MINS: tl.constexpr, IEEE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        row_ok, col_ok = rows < M, cols < N
        groups = K // GROUP
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            ks = k0 + tl.arange(0, BLOCK_K)
            k_ok = ks < K
            x = tl.load(x_ptr + rows[:, None] * K + ks[None, :],
                        mask=row_ok[:, None] & k_ok[None, :], other=0.0)  # fmt: skip
            wmask = col_ok[:, None] & k_ok[None, :]
            if BITS == 4:  # column j of a 32-block: byte j % 16, high nibble when j >= 16
                byte = (ks // 32) * 16 + ks % 16
                raw = tl.load(q_ptr + cols[:, None] * (K // 2) + byte[None, :], mask=wmask, other=0)
                shift = ((ks % 32) // 16) * 4
                q = ((raw.to(tl.int32) >> shift[None, :]) & 15).to(tl.float32)
            else:
                q = tl.load(q_ptr + cols[:, None] * K + ks[None, :], mask=wmask, other=0)
                q = q.to(tl.float32)
            g = cols[:, None] * groups + ks[None, :] // GROUP
            w = q * tl.load(s_ptr + g, mask=wmask, other=0.0).to(tl.float32)
            if HAS_MINS:  # scales and minimums may be held as fp16 (exact values)
                w = w + tl.load(m_ptr + g, mask=wmask, other=0.0).to(tl.float32)
            if IEEE:
                acc += tl.dot(x, tl.trans(w), input_precision="ieee")
            else:  # bf16/fp16 values are exact in tf32: the same products as a bf16 MMA
                wr = w.to(x.dtype).to(tl.float32)
                acc += tl.dot(x.to(tl.float32), tl.trans(wr), input_precision="tf32")
        out = acc.to(y_ptr.dtype.element_ty)
        tl.store(y_ptr + rows[:, None] * N + cols[None, :], out,
                 mask=row_ok[:, None] & col_ok[None, :])  # fmt: skip
