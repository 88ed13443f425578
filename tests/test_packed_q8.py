"""The packed products with 8-bit activations (SPECGEN_CPU_ACT=q8; kernels/cpu/q8*.c).

What "exact" means here: x's rows quantized per block of 32 as tests/q8_reference.py says,
bit for bit; the product then within an fp32 chain's bound of the exact (float64) product of
the dequantized weights and the dequantized rows, for every format on irregular shapes; a
row's result the same bits whatever the rows beside it, the row count, the path (direct or
staged) or the thread count; and the vector kernels the same bits as the portable one, so
every build (and so every machine) computes the same numbers (tests/test_packed_isa.py runs
this file in each build).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specgen.kernels.packed import cpu_library, packed_linear_cpu, q8_quantize_cpu
from specgen.models.formats.gguf.blocks import packed_from_blocks
from specgen.models.formats.packed_matrix import quantize
from support.packed import ALL_KINDS, random_blocks
from support.q8_reference import q8_product, quantize_rows

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")

SHAPES = [(1, 45, 512), (3, 17, 32), (5, 33, 288), (16, 50, 256), (17, 9, 544)]  # rows, N, K


def matrix(kind: str, n: int, k: int, seed: int):
    if kind.startswith("int"):  # --quantize int4|int8 with a group: "int4-g64"
        bits, group = int(kind[3]), int(kind.split("-g")[1])
        if k % group:
            pytest.skip(f"{k} columns are not groups of {group}")
        w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
        return quantize(w, bits, group)
    if "_K" in kind and k % 256:
        pytest.skip("K-quants come in super-blocks of 256")
    return packed_from_blocks(kind, random_blocks(kind, n, k, np.random.default_rng(seed)), n, k)


def rows_of(m: int, k: int, seed: int) -> torch.Tensor:
    """Rows of very different sizes, a zero block and a row of zeros among them."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 2, m)[:, None]
    x[0, :32] = 0
    if m > 2:
        x[2] = 0
    return x


def check(x: torch.Tensor, m) -> torch.Tensor:
    y = packed_linear_cpu(x, m, act="q8")
    exact, bound = q8_product(x, m)
    assert y.dtype == torch.float32 and y.shape == exact.shape
    assert ((y.double() - exact).abs() <= bound).all()
    assert torch.equal(y, packed_linear_cpu(x, m, act="q8-portable"))  # every build's bits
    return y


KINDS = [*ALL_KINDS, "int4-g32", "int4-g128", "int8-g16", "int8-g32", "int8-g256"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows,n,k", SHAPES)
def test_q8_products_are_the_quantized_rows_product(kind, rows, n, k):
    check(rows_of(rows, k, rows + n), matrix(kind, n, k, rows))


def test_rows_are_quantized_as_the_reference_says():
    x = rows_of(9, 320, 0)
    x[4, 32:64] = 0
    x[4, 40] = 1e-35  # a block under 2^-100 counts as zero
    x[6, :32] = torch.arange(32) - 15.5  # amax 127: x * 127 / amax = x, every value a tie
    x[6, 31] = 127.0
    q, d = q8_quantize_cpu(x)
    assert q[6, :4].tolist() == [-16, -14, -14, -12]  # ties to even
    rq, rd = quantize_rows(x)
    assert torch.equal(q, rq) and torch.equal(d, rd)
    assert q.abs().max() <= 127 and d[4, 1] == 0 and (q[4, 32:64] == 0).all()


def test_a_nan_or_infinity_poisons_its_own_row_only():
    m = matrix("Q4_1", 20, 256, 3)
    x = rows_of(6, 256, 4)
    clean = check(x, m)
    for bad in (float("nan"), float("inf"), -float("inf")):
        x2 = x.clone()
        x2[3, 77] = bad
        y = packed_linear_cpu(x2, m, act="q8")
        assert y[3].isnan().all()
        assert torch.equal(torch.cat([y[:3], y[4:]]), torch.cat([clean[:3], clean[4:]]))


@pytest.mark.parametrize("kind", ["Q4_1", "Q8_0", "Q6_K", "Q5_K", "int4-g64"])
def test_a_rows_result_never_depends_on_the_rows_or_threads_beside_it(kind):
    """Bit for bit: every row of a 37-row product (each panel's weights staged once) is
    what a one-row step gives (turned in registers), and so is each row of every smaller
    block, on 1, 2 and 3 threads."""
    m = matrix(kind, 70, 512, 1)
    x = rows_of(37, 512, 2)
    block = packed_linear_cpu(x, m, act="q8")
    alone = torch.cat([packed_linear_cpu(x[i : i + 1], m, act="q8") for i in range(37)])
    assert torch.equal(block, alone)
    for few in (2, 3, 4, 5, 8, 13, 16, 17):
        assert torch.equal(packed_linear_cpu(x[:few], m, act="q8"), block[:few])
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            big = torch.randn(64, 512, generator=torch.Generator().manual_seed(t))  # shared out
            want = torch.cat([packed_linear_cpu(big[i : i + 1], m, act="q8") for i in range(64)])
            assert torch.equal(packed_linear_cpu(big, m, act="q8"), want)
    finally:
        torch.set_num_threads(threads)


def test_stored_columns_in_another_order_take_their_inputs_with_them():
    order = torch.randperm(256, generator=torch.Generator().manual_seed(0))
    m = matrix("Q4_0", 24, 256, 5).permute_columns(order)
    x = rows_of(4, 256, 6)
    check(x, m)


def test_the_activations_are_chosen_by_name(monkeypatch):
    m = matrix("Q8_0", 16, 64, 0)
    x = rows_of(2, 64, 0)
    monkeypatch.setenv("SPECGEN_CPU_ACT", "q8")
    assert torch.equal(packed_linear_cpu(x, m), packed_linear_cpu(x, m, act="q8"))
    monkeypatch.setenv("SPECGEN_CPU_ACT", "FP32")
    assert torch.equal(packed_linear_cpu(x, m), packed_linear_cpu(x, m, act="fp32"))
    monkeypatch.setenv("SPECGEN_CPU_ACT", "int4")
    with pytest.raises(ValueError, match="SPECGEN_CPU_ACT='int4': use one of fp32, q8"):
        packed_linear_cpu(x, m)
