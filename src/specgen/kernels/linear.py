"""y = x W^T + b, with faster paths for the few-row products of decoding on the CPU.

A decode step multiplies one row (a verify block: a few rows) by every weight matrix; the
step is bound by streaming W from memory. How BLAS (MKL) handles those shapes on the CPU
decides whether that streaming uses the whole memory bandwidth:

- 1 row: `F.linear` is a matrix-vector product BLAS runs on one thread. Viewing W [out, in]
  as S blocks [S, out/S, in] (the same memory) and multiplying W-side-first, W @ x^T, as a
  batch spreads it over all threads and streams W at full bandwidth.
- 2..5 rows: W @ x^T (W as the left operand, few columns) is threaded by BLAS and streams
  W once; x @ W^T, what `F.linear` does, is several times slower for these shapes.
- 6..16 rows: the batched split on the x side is fastest (at 4-5 rows it is not, so those
  stay W-left).
- more rows (a prefill): plain `F.linear`, compute-bound and well threaded.

bf16/fp16 keep `F.linear`: their few-row kernels are already threaded, and batching them
is slower. The measurements that set these bounds: docs/results.md ("AR vs transformers").
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

MAX_W_LEFT_ROWS = 5  # up to here W @ x^T wins
MAX_SPLIT_ROWS = 16  # up to a verify block; beyond, BLAS threads well on its own
_MIN_ROWS_PER_BLOCK = 64  # below this the batching overhead outweighs the gain


def linear_torch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The reference: x [..., in] @ w[out, in]^T + b."""
    return F.linear(x, w, b)


def _blocks(out_features: int) -> int:
    blocks = 2 * torch.get_num_threads()  # two per thread balances uneven cores
    while blocks > 1 and (out_features % blocks or out_features // blocks < _MIN_ROWS_PER_BLOCK):
        blocks //= 2
    return blocks


def _transpose(y: torch.Tensor) -> torch.Tensor:  # [out, rows] -> [rows, out], contiguous
    """The few-row product's result, laid out row-major for what follows: numpy's copy, as
    torch's copy loop over a 2-wide inner dimension is several times slower. A copy: the
    same numbers."""
    if y.requires_grad:
        return y.t().contiguous()
    return torch.from_numpy(np.ascontiguousarray(y.numpy().T))


def linear(
    x: torch.Tensor,  # [..., in]
    w: torch.Tensor,  # [out, in]
    b: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [..., out]
    out_features, in_features = w.shape
    rows = x.numel() // in_features
    if x.device.type != "cpu" or x.dtype != torch.float32 or rows > MAX_SPLIT_ROWS:
        return F.linear(x, w, b)
    flat = x.reshape(rows, in_features)
    blocks = _blocks(out_features)
    if rows == 1 and blocks > 1:
        ws = w.view(blocks, out_features // blocks, in_features)
        # flat.t() (strides (1, in)), not a (in, 1) view with strides (1, 1): BLAS takes a
        # 5x slower path for the latter, although the two hold the same numbers.
        y = torch.bmm(ws, flat.t().expand(blocks, in_features, 1))
        y = y.view(1, out_features)
    elif rows <= MAX_W_LEFT_ROWS:
        y = _transpose(torch.mm(w, flat.t()))
    elif blocks > 1:
        xs = flat.view(1, rows, in_features).expand(blocks, rows, in_features)
        ws = w.view(blocks, out_features // blocks, in_features).transpose(1, 2)
        y = torch.bmm(xs, ws).transpose(0, 1).reshape(rows, out_features)
    else:
        return F.linear(x, w, b)
    y = y.view(*x.shape[:-1], out_features)
    return y if b is None else y + b
