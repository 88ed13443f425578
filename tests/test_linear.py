"""The CPU one-row split path of `linear` against its reference, on irregular shapes."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels.linear import _blocks, linear, linear_torch


@pytest.mark.parametrize(
    "out_features, in_features", [(960, 576), (49152, 64), (1000, 37), (256, 3), (7, 5)]
)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize(
    "lead", [(1,), (1, 1), (1, 1, 1), (1, 2), (1, 5), (2, 3), (1, 11), (1, 16)]
)
def test_one_row_matches_reference(out_features, in_features, bias, lead):
    gen = torch.Generator().manual_seed(out_features)
    w = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    x = torch.randn(*lead, in_features, generator=gen)
    got = linear(x, w, b)
    assert got.shape == (*lead, out_features)
    torch.testing.assert_close(got, linear_torch(x, w, b), atol=1e-4, rtol=1e-5)


def test_many_rows_and_half_precision_take_the_plain_path():
    w = torch.randn(512, 64)
    x = torch.randn(1, 40, 64)
    assert torch.equal(linear(x, w, None), linear_torch(x, w, None))
    xb, wb = x[:, :1].bfloat16(), w.bfloat16()
    assert torch.equal(linear(xb, wb, None), linear_torch(xb, wb, None))


def test_block_count_divides_and_keeps_blocks_large():
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _blocks(49152) == 4 and _blocks(960) == 4
        assert _blocks(100) == 1  # too small to be worth splitting
        assert _blocks(7) == 1
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [2, 3, 5])
def test_few_rows_come_back_row_major_with_the_same_numbers(rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(3072, 576, generator=gen)
    x = torch.randn(1, rows, 576, generator=gen)
    got = linear(x, w, None)
    assert got.is_contiguous()  # what follows views it by rows; a transposed layout is slow
    assert torch.equal(got[0], torch.mm(w, x[0].t()).t())  # a copy: not one bit moves


def test_few_rows_keep_their_gradient():
    w = torch.randn(64, 32, requires_grad=True)
    x = torch.randn(1, 3, 32, requires_grad=True)
    linear(x, w, None).sum().backward()
    torch.testing.assert_close(x.grad[0], w.sum(0).expand(3, 32).detach())
    torch.testing.assert_close(w.grad, x[0].sum(0).expand(64, 32).detach())
