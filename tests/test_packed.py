"""Packed weights (models/formats/packed_matrix.py, gguf_blocks.py, weights_packed.py,
kernels/packed.py).

What "exact" means: the model a quantized file defines is its dequantized weights, as the
`gguf` package dequantizes them. So (1) every GGUF format decodes to gguf's numbers bit for
bit; (2) the packed products equal the dequantized matrix's product up to fp32 summation
(checked against an fp64 product, with a bound from the sum of |w x|); (3) a row's result
does not depend on how many rows are multiplied with it (verify blocks are decode steps);
(4) a GGUF target loads to the same weights as its dequantized oracle and every method is
greedy-identical to AR on it (tests/test_packed_methods.py).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from specgen.kernels.packed import cpu_library, packed_linear_cpu, packed_linear_torch
from specgen.models.formats.gguf.blocks import packed_from_blocks
from specgen.models.formats.packed_matrix import PackedMatrix, quantize
from support.packed import ALL_KINDS, dequantized, random_blocks

ROWS, COLS = 37, 512  # odd rows: a partial column tile; two K-quant super-blocks


def fp32_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """|error| of an fp32 sum of K products, whatever the order: K eps sum |x w|."""
    return x.shape[-1] * 2.0**-24 * (x.abs().double() @ w.abs().double().T) + 1e-30


def check_product(x: torch.Tensor, m: PackedMatrix) -> None:
    w = m.dequantize()
    exact = x.double() @ w.double().T
    for y in (packed_linear_cpu(x, m, act="fp32"), packed_linear_torch(x, m)):
        assert y.dtype == torch.float32 and y.shape == exact.shape
        assert ((y.double() - exact).abs() <= fp32_bound(x, w)).all()


@pytest.fixture(scope="module", autouse=True)
def compiled():
    assert cpu_library() is not None, "the CPU kernel did not build (is a C compiler here?)"


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_each_gguf_format_decodes_to_ggufs_own_numbers(kind):
    """Random bytes cover every integer field's whole range (q, 6-bit scales and mins, the
    fifth and sixth bits); the fp16 fields are drawn, then set to edge values."""
    rng = np.random.default_rng(hash(kind) % 2**32)
    data = random_blocks(kind, ROWS, COLS, rng)
    m = packed_from_blocks(kind, data, ROWS, COLS)
    assert m.kind == kind and m.shape == (ROWS, COLS)
    want = torch.from_numpy(dequantized(kind, data).reshape(ROWS, COLS))
    assert torch.equal(m.dequantize(), want)
    edges = np.array([0.0, -0.0, 6.1e-5, 5.96e-8, -1.0, 65504.0, -65504.0, 1.0 / 3])
    halves = rng.choice(edges, data.shape[:1] + (COLS // (256 if "_K" in kind else 32), 2))
    at_edges = random_blocks(kind, ROWS, COLS, rng, halves=halves[..., : 2 if kind in (
        "Q4_1", "Q5_1", "Q4_K", "Q5_K") else 1])  # fmt: skip
    m = packed_from_blocks(kind, at_edges, ROWS, COLS)
    want = torch.from_numpy(dequantized(kind, at_edges).reshape(ROWS, COLS))
    assert torch.equal(m.dequantize(), want)


@pytest.mark.parametrize("kind", ALL_KINDS)
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 33])
def test_packed_products_are_the_dequantized_product(kind, rows):
    rng = np.random.default_rng(rows)
    m = packed_from_blocks(kind, random_blocks(kind, ROWS, COLS, rng), ROWS, COLS)
    x = torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows))
    check_product(x, m)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(kind):
    """Bit for bit: each row of a 37-row product (the kernel's many-row path, through
    scratch) is what a one-row step gives, and so is each row of the few-row products (its
    direct path: decode steps and verify blocks up to 16 rows)."""
    m = packed_from_blocks(kind, random_blocks(kind, 64, COLS, np.random.default_rng(1)), 64,
                           COLS)  # fmt: skip
    x = torch.randn(37, COLS, generator=torch.Generator().manual_seed(2))
    product = functools.partial(packed_linear_cpu, m=m, act="fp32")  # q8: test_packed_q8.py
    block = product(x)
    alone = torch.cat([product(x[i : i + 1]) for i in range(37)])
    assert torch.equal(block, alone)
    assert torch.equal(product(x[None, 3:9])[0], block[3:9])  # [B, T, K] input
    for few in (2, 3, 4, 5, 13, 16, 17):
        assert torch.equal(product(x[:few]), block[:few])
    for rows in (1, 4, 16):  # the same rows through both paths
        assert torch.equal(product(x[:rows], direct_rows=0), block[:rows])


@pytest.mark.parametrize("bits,group", [(8, 32), (8, 128), (4, 32), (4, 64), (4, 128)])
def test_quantize_on_load_rounds_each_weight_to_its_nearest_level(bits, group):
    gen = torch.Generator().manual_seed(bits * group)
    w = torch.randn(40, 256, generator=gen) * torch.rand(40, 1, generator=gen)
    w[3] = 0  # an all-zero row: a scale of 1, every q 0
    m = quantize(w, bits, group)
    assert m.kind == f"int{bits}-g{group}"
    back = m.dequantize()
    step = m.scale.repeat_interleave(group, dim=1)
    assert ((back - w).abs() <= step / 2 * (1 + 1e-6) + 1e-7).all()
    assert torch.equal(back[3], torch.zeros(256))
    # scales keep 11 significant bits, so scale * q is exact in fp32
    mant, _ = torch.frexp(m.scale)
    assert torch.equal(mant * 2**11, torch.round(mant * 2**11))
    check_product(torch.randn(3, 256, generator=gen), m)


def test_stacked_and_sliced_matrices_keep_their_rows():
    rng = np.random.default_rng(5)
    a = packed_from_blocks("Q4_1", random_blocks("Q4_1", 8, 64, rng), 8, 64)
    b = packed_from_blocks("Q4_1", random_blocks("Q4_1", 4, 64, rng), 4, 64)
    both = PackedMatrix.stack([a, b])
    assert torch.equal(both.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    assert torch.equal(both.narrow_rows(6, 10).dequantize(), both.dequantize()[6:10])
    ids = torch.tensor([11, 0, 5])
    assert torch.equal(both.dequantize(ids), both.dequantize()[ids])


def test_bad_packed_shapes_are_refused():
    with pytest.raises(ValueError, match="no kernel for 4-bit weights in groups of 16"):
        PackedMatrix(torch.zeros(2, 16, dtype=torch.uint8), torch.ones(2, 2), None, bits=4,
                     group=16, kind="x")  # fmt: skip
    with pytest.raises(ValueError, match="bad shapes"):
        PackedMatrix(torch.zeros(2, 32, dtype=torch.int8), torch.ones(2, 3), None, bits=8,
                     group=32, kind="x")  # fmt: skip
    with pytest.raises(ValueError, match="do not split into groups of 32"):
        quantize(torch.randn(4, 48), 4, 32)


def test_quantize_on_load_fits_the_group_to_each_matrix(monkeypatch):
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # held to the fp32 product
    from specgen.models.formats.packed_weight import Int4Weight
    from specgen.models.formats.weights import FORMATS, DenseWeight

    assert FORMATS["int4"] is Int4Weight
    gen = torch.Generator().manual_seed(3)
    for cols, kinds in ((576, ["int4-g32"]), (48, ["dense"])):  # 48: not whole 32-blocks
        dense = DenseWeight(8, cols, dtype=torch.float32, device=torch.device("cpu"))
        dense.weight.data.normal_(generator=gen)
        w = FORMATS["int4"].from_dense(dense)
        assert w.kinds == kinds
        x = torch.randn(2, cols, generator=gen)
        exact = x.double() @ w.dense().double().T  # the product up to fp32 summation
        assert ((w(x).double() - exact).abs() <= fp32_bound(x, w.dense())).all()
    from specgen.models.formats.packed_weight import _quantized

    dense = DenseWeight(8, 576, dtype=torch.float32, device=torch.device("cpu"))
    assert _quantized(8, 128).from_dense(dense).kinds == ["int8-g64"]  # 576 = 9 x 64
