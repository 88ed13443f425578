"""Block attention over a static cache (device-resident length) against its reference, and
the reference against the model's own attention path."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels import triton_available
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention_torch

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 3e-2}


def _case(b, nq, nkv, t, cap, n, d, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, nq, t, d, generator=gen)
    k = torch.randn(b, nkv, cap, d, generator=gen)
    v = torch.randn(b, nkv, cap, d, generator=gen)
    k[:, :, n:] = float("nan")  # past the length: never read
    v[:, :, n:] = float("nan")
    length = torch.tensor([n], dtype=torch.int32)
    return [x.to(DEVICE, dtype) for x in (q, k, v)] + [length.to(DEVICE)]


@pytest.mark.parametrize(
    "b, nq, nkv, t, cap, n, d",
    [
        (1, 4, 2, 1, 300, 37, 16),  # decode: one query
        (1, 8, 2, 16, 600, 555, 32),  # a 16-token block, several chunks, GQA 4
        (2, 2, 2, 5, 256, 256, 64),  # a full cache, no GQA
        (1, 9, 3, 7, 520, 260, 64),  # SmolLM2's 9/3 heads; length just past one chunk
    ],
)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dtype", list(TOLERANCE))
def test_kernel_matches_the_reference(b, nq, nkv, t, cap, n, d, causal, dtype):
    from specgen.kernels.block_attention import block_attention_triton

    q, k, v, length = _case(b, nq, nkv, t, cap, n, d, dtype, seed=n + t)
    got = block_attention_triton(q, k, v, length, causal)
    want = block_attention_torch(q, k, v, length, causal)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [True, False])
def test_the_reference_is_the_models_attention(causal):
    q, k, v, length = (x.cpu() for x in _case(1, 4, 2, 6, 100, 40, 16, torch.float32, 0))
    mask = torch.ones(6, 40, dtype=torch.bool).tril(34) if causal else None
    want = attention(q, k[:, :, :40], v[:, :, :40], mask, False)
    torch.testing.assert_close(block_attention_torch(q, k, v, length, causal), want)


@pytest.mark.parametrize("t, n, window", [(1, 300, 7), (8, 270, 5), (16, 555, 40)])
@pytest.mark.parametrize("causal", [True, False])
def test_kernel_matches_the_reference_with_a_sliding_window(t, n, window, causal):
    from specgen.kernels.block_attention import block_attention_triton

    q, k, v, length = _case(1, 8, 2, t, 600, n, 32, torch.float32, seed=n + window)
    got = block_attention_triton(q, k, v, length, causal, window)
    want = block_attention_torch(q, k, v, length, causal, window)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_a_sliding_window_is_the_drafters_window_mask():
    from specgen.models.drafters.dflash import _window_mask

    q, k, v, length = (x.cpu() for x in _case(1, 4, 2, 6, 100, 40, 16, torch.float32, 1))
    want = attention(q, k[:, :, :40], v[:, :, :40], _window_mask(5, 34, 6, "cpu"), False)
    got = block_attention_torch(q, k, v, length, False, window=5)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("window", [None, 40])
def test_kernel_takes_a_score_scale(window):
    """Gemma 4 attends with scale 1 (its q/k norms keep the scores tame)."""
    from specgen.kernels.block_attention import block_attention_masked, block_attention_triton

    q, k, v, length = _case(1, 8, 2, 5, 600, 555, 32, torch.float32, seed=3)
    want = block_attention_torch(q / 4, k, v, length, True, window, scale=1.0)
    got = block_attention_triton(q / 4, k, v, length, True, window, scale=1.0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    k, v = k.nan_to_num(0.0), v.nan_to_num(0.0)  # the masked form weighs these by 0
    masked = block_attention_masked(q / 4, k, v, length, True, window, scale=1.0)
    torch.testing.assert_close(masked, want, rtol=1e-4, atol=1e-4)


def test_chunks_before_the_window_are_never_read():
    """Keys [0, 256) lie before every query's window: the kernel skips their chunk (NaN there
    would otherwise poison the sums, as 0 * NaN does)."""
    from specgen.kernels.block_attention import block_attention_triton

    q, k, v, length = _case(1, 8, 2, 5, 600, 555, 32, torch.float32, seed=4)
    want = block_attention_torch(q, k, v, length, True, 40)
    k[:, :, :256], v[:, :, :256] = float("nan"), float("nan")
    torch.testing.assert_close(block_attention_triton(q, k, v, length, True, 40), want)
