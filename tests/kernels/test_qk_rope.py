"""Fused q/k-norm + RoPE against its torch reference (the layer's eager ops)."""

from __future__ import annotations

import pytest
import torch

from specgen.core.config import RopeArgs
from specgen.kernels import triton_available
from specgen.kernels.qk_rope import qk_norm_rope_torch
from specgen.models.layers.rope import rope_tables

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.parametrize(
    "b, t, nq, nkv, d", [(1, 1, 9, 3, 64), (2, 5, 16, 8, 128), (1, 7, 4, 2, 16)]
)
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_kernel_matches_the_reference(b, t, nq, nkv, d, dtype):
    from specgen.kernels.qk_rope import qk_norm_rope_triton

    gen = torch.Generator().manual_seed(b * t * d)
    qk = (torch.randn(b, t, nq + nkv, d, generator=gen) * 4).to(DEVICE, dtype)
    qw = (1 + 0.2 * torch.randn(d, generator=gen)).to(DEVICE, dtype)
    kw = (1 + 0.2 * torch.randn(d, generator=gen)).to(DEVICE, dtype)
    cos, sin = rope_tables(RopeArgs(theta=1e6), d, 300, dtype=dtype, device=torch.device(DEVICE))
    start = 290 - t  # positions deep in the table, not just the first rows
    cos, sin = cos[start : start + t], sin[start : start + t]
    got = qk_norm_rope_triton(qk, nq, qw, kw, cos, sin, 1e-6)
    want = qk_norm_rope_torch(qk, nq, qw, kw, cos, sin, 1e-6)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
