"""The graph-capturable step path (models/graphs.py) on the CPU: the same code a CUDA
graph captures, run eagerly, must give the eager forward's logits and the same tokens.
The capture itself is tested on CUDA (tests/test_gpu.py)."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.kernels.block_attention import block_attention_masked, block_attention_torch
from specgen.models.graphs import GREEDY, GraphedForward
from specgen.models.loading import load_target


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t, n", [(1, 1), (1, 37), (6, 40), (16, 100)])
def test_masked_block_attention_is_the_reference(causal, t, n, window):
    gen = torch.Generator().manual_seed(n + t)
    q = torch.randn(1, 8, t, 16, generator=gen)
    k, v = (torch.randn(1, 2, 100, 16, generator=gen) for _ in range(2))
    length = torch.tensor([n], dtype=torch.int32)
    want = block_attention_torch(q, k, v, length, causal, window)
    got = block_attention_masked(q, k, v, length, causal, window)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_static_forward_is_the_forward(tiny_qwen3_deep):
    """The static step (positions on the device, attention over the whole capacity with a
    mask) computes the eager forward's maths in another summation order, so the two differ
    by fp32 rounding, which depends on the machine's kernels: a fixed atol failed on one
    machine (one tap element 1.1e-5 off, where the eager fp32 path is itself 1.4e-5 off
    the fp64 forward). So both are held against the float64 forward, and the static path
    may be off by no more than a few times what the eager fp32 path is off by itself; a
    real fault (a wrong position, mask or cache slot) is off by orders more."""

    def steps(dtype: torch.dtype):
        model = load_target(tiny_qwen3_deep, dtype=dtype, device="cpu")
        prompt, block = torch.tensor([[5, 9, 2, 7, 1, 3]]), torch.tensor([[4, 8, 6, 2]])
        eager, static = model.new_cache(32), model.new_cache(32)
        static.k.zero_(), static.v.zero_()
        model(prompt, eager, num_logits=1)
        model(prompt, static, num_logits=1)
        out = []
        for t in (1, 4):  # a decode step, then a verify block
            want = model(block[:, :t], eager, taps=(0, 2))
            start = static.reserve(t)
            got = model.forward_static(block[:, :t], static, torch.tensor([start]), taps=(0, 2))
            static.commit(start + t)
            out.append((want, got))
        assert static.length == eager.length
        return out

    for (eager, static), (exact, _) in zip(steps(torch.float32), steps(torch.float64), strict=True):
        pairs = [(eager.logits, static.logits, exact.logits)]
        pairs += [(eager.taps[i], static.taps[i], exact.taps[i]) for i in (0, 2)]
        for fp32, fast, fp64 in pairs:
            rounding = (fp32.double() - fp64).abs().max().item()  # the fp32 path's own error
            assert 0 < rounding < 1e-3  # fp32 rounding, not a fault of the eager path
            assert (fast.double() - fp64).abs().max().item() <= 4 * rounding


def _static_session(pipe: Pipeline):
    session = pipe.new_session()
    max_tokens = 1 + (session.drafter.max_draft_tokens if session.drafter else 0)
    session.forward = GraphedForward(
        pipe.model, session.cache, max_tokens=max_tokens, capture=False
    )
    return session


@pytest.mark.parametrize("method", ["ar", "dflash", "dspark"])
def test_decoding_through_the_static_step_is_exact(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, method
):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    drafter = {"ar": None, "dflash": str(tiny_dflash), "dspark": str(tiny_dspark)}[method]
    pipe = ar if method == "ar" else ar.with_spec(SpecConfig(method=method, drafter=drafter))
    session = _static_session(pipe)
    for prompt in ("The quick brown fox", "one two one two one two"):  # the second: a chat turn
        want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=30, session=session)
        assert got.token_ids == want.token_ids
    assert session.forward._steps  # the static path really ran
    sampled = SamplingParams(temperature=0.9, top_k=20, seed=4)
    want = pipe.generate(
        "def add(a, b):", sampling=sampled, max_new_tokens=20, session=pipe.new_session()
    )
    got = pipe.generate(
        "def add(a, b):", sampling=sampled, max_new_tokens=20, session=_static_session(pipe)
    )
    assert got.token_ids == want.token_ids


def test_graphs_need_cuda(tiny_qwen3_deep):
    model = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    with pytest.raises(ValueError, match="CUDA"):
        GraphedForward(model, model.new_cache(8), max_tokens=1, capture=True)
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    assert pipe.new_session().forward is pipe.model  # never graphed on the CPU


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_static_draft_step_drafts_the_same(tiny_qwen3_deep, tiny_dflash, tiny_dspark, kind):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    drafter = str(tiny_dflash if kind == "dflash" else tiny_dspark)
    spec = SpecConfig(method=kind, drafter=drafter, verify_policy="full", trace=True)
    pipe = ar.with_spec(spec)
    assert not pipe.method.cuda_graphs  # CPU: eager
    eager, static = pipe.new_session(), pipe.new_session()
    static.drafter.steps = static.drafter.steps.uncaptured()
    for prompt in ("The quick brown fox", "one two one two one two"):
        want = pipe.generate(prompt, max_new_tokens=30, session=eager)
        got = pipe.generate(prompt, max_new_tokens=30, session=static)
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
        for a, b in zip(got.stats.trace, want.stats.trace, strict=True):  # DSpark's c_j
            assert a.get("confidence") == pytest.approx(b.get("confidence"), abs=1e-5)
    assert static.drafter.steps.step(GREEDY)._replay is not None  # the static step really drafted


def test_sampled_dspark_draft_step_has_fixed_shapes(tiny_qwen3_deep, tiny_dspark):
    """A sampled DSpark draft reads its races from a buffer filled before the step, so the
    fixed-shape step (a CUDA graph on CUDA) drafts what the eager draft does, seed for
    seed, distributions included."""
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dspark", drafter=str(tiny_dspark), verify_policy="full", trace=True)
    pipe = ar.with_spec(spec)
    eager, static = pipe.new_session(), pipe.new_session()
    static.drafter.steps = static.drafter.steps.uncaptured()
    for seed, top_p in ((1, 1.0), (2, 0.9)):
        params = SamplingParams(temperature=0.8, top_k=30, top_p=top_p, seed=seed)
        kw = dict(sampling=params, max_new_tokens=24)
        want = pipe.generate("The quick brown fox", session=eager, **kw)
        got = pipe.generate("The quick brown fox", session=static, **kw)
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
    # one step per filter setting
    assert len([k for k in static.drafter.steps.keys() if k != GREEDY]) == 2


def test_a_failed_capture_falls_back_to_eager(tiny_qwen3_deep, tiny_dflash, monkeypatch):
    from specgen.models import graphs as cuda_graphs

    def broken(self, fn, pool=None):
        raise RuntimeError("operation not permitted when stream is capturing")

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    # every step drafts (no cost scheduler that might skip drafting on a busy machine)
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full")
    pipe = ar.with_spec(spec)
    want = pipe.generate("The quick brown fox", max_new_tokens=20, session=pipe.new_session())
    session = _static_session(pipe)
    session.drafter.steps = session.drafter.steps.uncaptured()
    monkeypatch.setattr(cuda_graphs.Replay, "__init__", broken)
    with pytest.warns(RuntimeWarning, match="decodes without graphs"):
        got = pipe.generate("The quick brown fox", max_new_tokens=20, session=session)
    assert got.token_ids == want.token_ids
    assert session.forward.failed and not session.drafter.steps.on


def test_a_sliding_window_drafter_drafts_the_same_with_fixed_shapes(
    tiny_qwen3_deep, tmp_path, monkeypatch
):
    """A drafter with sliding-window layers: its fixed-shape draft step (graph-capturable)
    and the resident loop built on it draft and decode as the eager drafter does."""
    from support.drafters import save_tiny_dflash

    drafter = save_tiny_dflash(
        tmp_path / "sliding",
        target_layer_ids=[1, 3],
        layer_types=["sliding_attention", "full_attention"],
        sliding_window=4,
    )
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full", trace=True)
    pipe = ar.with_spec(spec)
    assert pipe.method.net.args.windows[0] == 4
    eager, static = pipe.new_session(), pipe.new_session()
    static.drafter.steps = static.drafter.steps.uncaptured()
    prompt = "one two three four five six seven"  # a context longer than the window
    want = pipe.generate(prompt, max_new_tokens=24, session=eager)
    got = pipe.generate(prompt, max_new_tokens=24, session=static)
    assert got.token_ids == want.token_ids
    assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    resident = pipe.generate(prompt, max_new_tokens=24, session=pipe.new_session())
    assert [r["draft"] for r in resident.stats.trace] == [r["draft"] for r in want.stats.trace]
