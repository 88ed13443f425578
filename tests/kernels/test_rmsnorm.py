"""Fused RMSNorm (+ residual add) against its torch reference on irregular shapes."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels import triton_available
from specgen.kernels.rmsnorm import rms_norm_torch

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}  # rtol = atol


@pytest.mark.parametrize("shape", [(1, 576), (3, 7, 64), (5, 100), (2, 1, 2560)])
@pytest.mark.parametrize("dtype", list(TOLERANCE))
@pytest.mark.parametrize("residual", [False, True])
def test_kernel_matches_the_reference(shape, dtype, residual):
    from specgen.kernels.rmsnorm import rms_norm_triton

    gen = torch.Generator().manual_seed(sum(shape))
    x = (torch.randn(*shape, generator=gen) * 3).to(DEVICE, dtype)
    r = (torch.randn(*shape, generator=gen) * 50).to(DEVICE, dtype) if residual else None
    w = (1 + 0.1 * torch.randn(shape[-1], generator=gen)).to(DEVICE, dtype)
    got, got_h = rms_norm_triton(x, w, 1e-6, r)
    want, want_h = rms_norm_torch(x, w, 1e-6, r)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    # the add is the same add; Triton's interpreter rounds fp32 -> bf16 differently from
    # torch's round-to-nearest-even, so there it may land one bf16 ulp away
    ulp = 2**-7 if dtype == torch.bfloat16 else 0.0
    torch.testing.assert_close(got_h, want_h, rtol=ulp, atol=0)
    assert got.dtype == dtype and got.shape == x.shape


def test_the_reference_is_transformers_rounding():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm_torch(x, w, 1e-6)[0], want)
