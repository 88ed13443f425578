"""The gated delta rule: specgen's recurrent and chunked forms against transformers' (the
oracle), each other, and the Triton kernel; the per-token states a speculative decoder
rolls back to; and the bitwise independence of the recurrent form from the block length."""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn.functional as F

from specgen.kernels import triton_available
from specgen.kernels.gated_delta import (
    gated_delta_chunked,
    gated_delta_chunked_torch,
    gated_delta_recurrent,
    gated_delta_recurrent_torch,
)

needs_triton = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
# fp32 throughout: each token's state update rounds at ~1e-7 relative and the decays keep the
# state O(1), so independent evaluations of the same maths agree to ~1e-6 at these lengths;
# 1e-5 leaves room without hiding a wrong term (those show up at 1e-2 and more).
TOL = 1e-5
# (B, Hk, Hv, dk, dv): plain heads, grouped value heads (Hv = 2 Hk), dk != dv
SHAPES = [(1, 2, 2, 16, 32), (2, 2, 4, 32, 16)]


def _transformers():
    from transformers.models.qwen3_5 import modeling_qwen3_5 as m

    # unwrapped: with fla installed, transformers would route these to fla's kernels
    return inspect.unwrap(m.torch_recurrent_gated_delta_rule), inspect.unwrap(
        m.torch_chunk_gated_delta_rule
    )


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def inputs(b, t, hk, hv, dk, dv, seed=0, device="cpu"):
    """Raw (q, k) for transformers, then specgen's (q, k, v, g, beta, state)."""
    gen = torch.Generator().manual_seed(seed)
    q_raw, k_raw = (torch.randn(b, t, hk, dk, generator=gen) for _ in range(2))
    v = torch.randn(b, t, hv, dv, generator=gen)
    g = -F.softplus(torch.randn(b, t, hv, generator=gen)) * 0.5
    beta = torch.randn(b, t, hv, generator=gen).sigmoid()
    state = torch.randn(b, hv, dk, dv, generator=gen) * 0.5
    q = l2norm(q_raw) * dk**-0.5
    ours = tuple(x.to(device) for x in (q, l2norm(k_raw), v, g, beta, state))
    return (q_raw, k_raw), ours


def close(got, want, tol=TOL):
    scale = want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=tol, atol=tol * max(scale, 1.0))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [1, 5, 17, 65])
def test_recurrent_matches_transformers(shape, t):
    b, hk, hv, dk, dv = shape
    (q_raw, k_raw), (q, k, v, g, beta, state) = inputs(b, t, hk, hv, dk, dv, seed=t)
    recurrent, _ = _transformers()
    want, want_state = recurrent(
        q_raw, k_raw, v, g, beta, state.clone(), True, use_qk_l2norm_in_kernel=True
    )
    got, got_state = gated_delta_recurrent_torch(q, k, v, g, beta, state)
    close(got, want)
    close(got_state, want_state)
    assert got.shape == (b, t, hv, dv) and got_state.shape == (b, hv, dk, dv)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("t", [1, 5, 63, 64, 65, 130])
def test_chunked_matches_transformers_and_recurrent(shape, t):
    b, hk, hv, dk, dv = shape
    (q_raw, k_raw), (q, k, v, g, beta, state) = inputs(b, t, hk, hv, dk, dv, seed=100 + t)
    _, chunked = _transformers()
    want, want_state = chunked(
        q_raw, k_raw, v, g, beta, 64, state.clone(), True, use_qk_l2norm_in_kernel=True
    )
    got, got_state = gated_delta_chunked_torch(q, k, v, g, beta, state)
    close(got, want)
    close(got_state, want_state)
    rec, rec_state = gated_delta_recurrent_torch(q, k, v, g, beta, state)
    close(got, rec)
    close(got_state, rec_state)


def test_chunked_with_small_chunks_and_strong_decay():
    """Several chunks per sequence, and decays that underflow exp() within a chunk."""
    _, (q, k, v, g, beta, state) = inputs(2, 37, 1, 2, 16, 16, seed=7)
    g = g * 40  # cumulative log decay down to ~ -1000 in a chunk
    got, got_state = gated_delta_chunked_torch(q, k, v, g, beta, state, chunk=8)
    want, want_state = gated_delta_recurrent_torch(q, k, v, g, beta, state)
    close(got, want)
    close(got_state, want_state)
    assert torch.isfinite(got).all()


def test_keep_holds_the_state_after_every_token():
    b, hk, hv, dk, dv = SHAPES[1]
    t = 6
    _, (q, k, v, g, beta, state) = inputs(b, t, hk, hv, dk, dv, seed=3)
    before = state.clone()
    keep = torch.full((b, t, hv, dk, dv), float("nan"))
    out, final = gated_delta_recurrent_torch(q, k, v, g, beta, state, keep)
    assert torch.equal(state, before)
    assert final.data_ptr() == keep[:, -1].data_ptr() and final.shape == (b, hv, dk, dv)
    for i in range(t):
        n = i + 1
        prefix = (x[:, :n] for x in (q, k, v, g, beta))
        out_i, state_i = gated_delta_recurrent_torch(*prefix, state)
        assert torch.equal(keep[:, i], state_i)
        assert torch.equal(out[:, :n], out_i)


def test_recurrent_is_bitwise_independent_of_the_block_length():
    b, hk, hv, dk, dv = SHAPES[1]
    _, (q, k, v, g, beta, state) = inputs(b, 5, hk, hv, dk, dv, seed=4)
    out, final = gated_delta_recurrent_torch(q, k, v, g, beta, state)
    s, outs = state, []
    for i in range(5):
        o, s = gated_delta_recurrent_torch(*(x[:, i : i + 1] for x in (q, k, v, g, beta)), s)
        outs.append(o)
    assert torch.equal(torch.cat(outs, dim=1), out)
    assert torch.equal(s, final)


def test_the_dispatchers_fall_back_to_torch_on_the_cpu():
    _, args = inputs(1, 9, 2, 4, 16, 16, seed=5)
    for fn, ref in (
        (gated_delta_recurrent, gated_delta_recurrent_torch),
        (gated_delta_chunked, gated_delta_chunked_torch),
    ):
        got, got_state = fn(*args)
        want, want_state = ref(*args)
        assert torch.equal(got, want) and torch.equal(got_state, want_state)


def _replay_case(b, t, hk, hv, dk, dv, seed, tape=6, device="cpu"):
    """A block of t tokens after a tape of `tape` earlier ones (zero-padded to 8)."""
    _, (q, k, v, g, beta, state) = inputs(b, tape + t, hk, hv, dk, dv, seed=seed, device=device)
    pad = 8 - tape
    recorded = tuple(
        torch.cat((x[:, :tape], torch.zeros_like(x[:, :pad])), dim=1) for x in (q, k, v, g, beta)
    )
    block = tuple(x[:, tape:] for x in (q, k, v, g, beta))
    whole = (q, k, v, g, beta)
    return block, state, recorded, whole


@pytest.mark.parametrize("replay", [0, 1, 4, 6])
@pytest.mark.parametrize("on_device", [False, True])
def test_replaying_a_tape_is_running_its_tokens_again(replay, on_device):
    """The block after `replay` tape tokens: bitwise what one run over those tokens and the
    block gives (host count), or with the unused tape masked (device count)."""
    from specgen.kernels.gated_delta import gated_delta_replay_torch

    b, hk, hv, dk, dv = SHAPES[1]
    block, state, tape, whole = _replay_case(b, 3, hk, hv, dk, dv, seed=7)
    before = state.clone()
    kept = tuple(x[:, list(range(replay)) + list(range(6, 9))] for x in whole)
    want, _ = gated_delta_recurrent_torch(*kept, state)
    start = torch.empty_like(state)
    count = torch.tensor([replay]) if on_device else replay
    got = gated_delta_replay_torch(*block, state, tape, count, start)
    assert torch.equal(state, before)
    want_start = gated_delta_recurrent_torch(*(x[:, :replay] for x in whole), state)[1]
    assert torch.equal(got, want[:, replay:]) and torch.equal(start, want_start)


# (B, T, Hk, Hv, dk, dv). Triton runs interpreted on the CPU (slowly): small shapes, and one
# at Qwen3.5's head size
TRITON_CASES = [
    (1, 3, 1, 1, 16, 32),
    (2, 5, 2, 4, 16, 32),
    (2, 4, 1, 2, 32, 16),
    (1, 2, 2, 2, 128, 128),
]


@needs_triton
@pytest.mark.parametrize("case", TRITON_CASES)
@pytest.mark.parametrize("with_keep", [False, True])
def test_triton_matches_the_recurrent_reference(case, with_keep):
    from specgen.kernels.gated_delta import gated_delta_recurrent_triton

    b, t, hk, hv, dk, dv = case
    _, args = inputs(b, t, hk, hv, dk, dv, seed=sum(case), device=DEVICE)
    state = args[-1]
    before = state.clone()
    keep = torch.empty(b, t, hv, dk, dv, device=DEVICE) if with_keep else None
    got, got_state = gated_delta_recurrent_triton(*args, keep=keep)
    want_keep = torch.empty(b, t, hv, dk, dv, device=DEVICE)
    want, want_state = gated_delta_recurrent_torch(*args, keep=want_keep)
    close(got, want)
    close(got_state, want_state)
    assert torch.equal(state, before)
    if with_keep:
        close(keep, want_keep)
        assert got_state.data_ptr() == keep[:, -1].data_ptr()


@needs_triton
def test_triton_is_bitwise_independent_of_the_block_length():
    from specgen.kernels.gated_delta import gated_delta_recurrent_triton

    _, (q, k, v, g, beta, state) = inputs(1, 4, 1, 2, 16, 16, seed=6, device=DEVICE)
    out, final = gated_delta_recurrent_triton(q, k, v, g, beta, state)
    s, outs = state, []
    for i in range(4):
        o, s = gated_delta_recurrent_triton(*(x[:, i : i + 1] for x in (q, k, v, g, beta)), s)
        outs.append(o)
    assert torch.equal(torch.cat(outs, dim=1), out)
    assert torch.equal(s, final)


@needs_triton
@pytest.mark.parametrize("case", TRITON_CASES)
@pytest.mark.parametrize("replay", [0, 3])
def test_triton_replay_kernel_matches_the_torch_form(case, replay):
    from specgen.kernels.gated_delta import gated_delta_replay_torch, gated_delta_replay_triton

    b, t, hk, hv, dk, dv = case
    block, state, tape, _ = _replay_case(b, t, hk, hv, dk, dv, seed=sum(case), tape=5,
                                         device=DEVICE)  # fmt: skip
    want_start, got_start = torch.empty_like(state), torch.empty_like(state)
    want = gated_delta_replay_torch(*block, state, tape, replay, want_start)
    got = gated_delta_replay_triton(*block, state, tape, torch.tensor([replay]), got_start)
    close(got, want)
    close(got_start, want_start)


@pytest.mark.gpu
@pytest.mark.parametrize("t", [1, 100, 300])
def test_fla_prefill_matches_the_torch_chunked_form(t):
    pytest.importorskip("fla.ops.gated_delta_rule", reason="fla-core not installed")
    from specgen.kernels.gated_delta import _fla_chunk

    assert _fla_chunk() is not None
    _, args = inputs(2, t, 2, 4, 128, 128, seed=t, device="cuda")
    got, got_state = gated_delta_chunked(*args)
    want, want_state = gated_delta_chunked_torch(*args)
    # fla's tl.dot runs fp32 inputs through TF32 (10-bit mantissa)
    close(got, want, tol=5e-3)
    close(got_state, want_state, tol=5e-3)
