"""y = x W^T + b, with a faster path for one-token steps on the CPU.

On the CPU, BLAS runs a matrix-vector product (one token, the whole of AR decoding) on a
single thread, so a decode step uses one core of the machine's memory bandwidth. Viewing
W [out, in] as S stacked blocks [S, out/S, in] (a free view of the same memory) turns the
product into a batched one that torch spreads over all its threads: each thread streams
its own rows of W. Measured on a 2-core AMD EPYC at SmolLM2-135M shapes in fp32: a whole
decode step's matmuls take 29 ms instead of 55 ms (benchmarks/ar_vs_transformers.py shows
the end-to-end effect). Prefill and verify blocks (several rows) already run multi-threaded
in BLAS and take the plain path, as do bf16/fp16, whose one-row kernel is threaded.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_MIN_ROWS_PER_BLOCK = 64  # below this the batching overhead outweighs the gain


def linear_torch(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """The reference: x [..., in] @ w[out, in]^T + b."""
    return F.linear(x, w, b)


def _blocks(out_features: int) -> int:
    blocks = 2 * torch.get_num_threads()  # two per thread balances uneven cores
    while blocks > 1 and (out_features % blocks or out_features // blocks < _MIN_ROWS_PER_BLOCK):
        blocks //= 2
    return blocks


def linear(
    x: torch.Tensor,  # [..., in]
    w: torch.Tensor,  # [out, in]
    b: torch.Tensor | None,  # [out]
) -> torch.Tensor:  # [..., out]
    out_features, in_features = w.shape
    # Half precision already has a multi-threaded one-row kernel; batching it is slower.
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.numel() != in_features:
        return F.linear(x, w, b)
    blocks = _blocks(out_features)
    if blocks == 1:
        return F.linear(x, w, b)
    xs = x.reshape(1, 1, in_features).expand(blocks, 1, in_features)
    ws = w.view(blocks, out_features // blocks, in_features).transpose(1, 2)
    y = torch.bmm(xs, ws).view(*x.shape[:-1], out_features)
    return y if b is None else y + b
