"""The Triton packed-weight kernel against its torch reference (the dequantized matrix's
product), on every packed kind, decode rows and verify blocks, fp32 and bf16."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specgen.kernels import triton_available
from specgen.kernels.packed import packed_linear_torch
from specgen.models.formats.gguf.blocks import packed_from_blocks
from specgen.models.formats.packed_matrix import quantize
from support.packed import ALL_KINDS, random_blocks

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def matrices():
    rng = np.random.default_rng(0)
    for kind in ALL_KINDS:  # 70 rows: a partial column tile; 512 columns: 8 K steps
        yield kind, packed_from_blocks(kind, random_blocks(kind, 70, 512, rng), 70, 512)
    w = torch.randn(70, 512, generator=torch.Generator().manual_seed(1))
    yield "int4-g128", quantize(w, 4, 128)
    yield "int8-g64", quantize(w, 8, 64)
    # stored columns in another order (Qwen3.5's ssm_out): the kernel reads its input gathered
    k = packed_from_blocks("Q4_K", random_blocks("Q4_K", 70, 512, rng), 70, 512)
    order = torch.randperm(512, generator=torch.Generator().manual_seed(2))
    yield "Q4_K-gathered", k.permute_columns(order)


@pytest.mark.parametrize("kind,m", list(matrices()), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("rows", [1, 17])
def test_triton_kernel_matches_the_reference(kind, m, rows):
    from specgen.kernels.packed_triton import packed_linear_triton

    m = m.to(DEVICE)
    x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows)).to(DEVICE)
    got = packed_linear_triton(x, m)
    want = packed_linear_torch(x.double(), m)
    bound = 512 * 2.0**-23 * (x.abs().double() @ m.dequantize().abs().double().T)
    assert ((got.double() - want).abs() <= bound + 1e-30).all()
    # bf16 activations: the matrix dequantized to bf16, products summed in fp32
    xb = x.to(torch.bfloat16)
    got_b = packed_linear_triton(xb, m)
    want_b = xb.double() @ m.dequantize(dtype=torch.bfloat16).double().T
    assert got_b.dtype == torch.bfloat16
    torch.testing.assert_close(
        got_b.double(), want_b, rtol=1e-2, atol=1e-2 * want_b.abs().max().item()
    )
    # a row's result does not depend on the rows beside it
    for i in {0, rows // 2, rows - 1}:
        assert torch.equal(packed_linear_triton(x[i : i + 1], m)[0], got[i])
