"""DFlash 2 wherever the other block drafters run: the fixed-shape draft step (a CUDA
graph on CUDA) drafts what the eager one does, greedy and sampled seed for seed; the
device-resident loop matches the sync loop; `stacked` mounts it beside DFlash; on a GPU
the graphs replay the eager steps."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.models.graphs import GREEDY

PROMPTS = ("The quick brown fox", "one two one two one two")


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _spec(drafter, **kw):
    return SpecConfig(method="dflash2", drafter=str(drafter), verify_policy="full", **kw)


def test_the_fixed_shape_step_drafts_what_the_eager_one_does(ar, tiny_dflash2):
    pipe = ar.with_spec(_spec(tiny_dflash2, trace=True))
    assert not pipe.method.cuda_graphs  # CPU: eager
    eager, static = pipe.new_session(), pipe.new_session()
    static.drafter.steps = static.drafter.steps.uncaptured()
    for prompt in PROMPTS:
        want = pipe.generate(prompt, max_new_tokens=30, session=eager)
        got = pipe.generate(prompt, max_new_tokens=30, session=static)
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
    for seed, temperature in ((1, 0.8), (2, 1.3)):
        params = SamplingParams(temperature=temperature, top_k=30, seed=seed)
        kw = dict(sampling=params, max_new_tokens=24)
        want = pipe.generate("The quick brown fox", session=eager, **kw)
        got = pipe.generate("The quick brown fox", session=static, **kw)
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
    assert static.drafter.steps.step(GREEDY)._replay is not None
    # one sampled step per temperature
    assert len([k for k in static.drafter.steps.keys() if k != GREEDY]) == 2


def test_the_resident_loop_matches_the_sync_loop(ar, tiny_dflash2, monkeypatch):
    pipe = ar.with_spec(_spec(tiny_dflash2, engine="sync"))
    sync_session = pipe.new_session()
    sync = [pipe.generate(p, max_new_tokens=30, session=sync_session) for p in PROMPTS]
    sampled = SamplingParams(temperature=0.9, top_k=20, seed=4)
    sync_sampled = pipe.generate("def add(a, b):", sampling=sampled, max_new_tokens=20)
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    session = pipe.new_session()
    for want, prompt in zip(sync, PROMPTS, strict=True):
        got = pipe.generate(prompt, max_new_tokens=30, session=session)
        assert got.token_ids == want.token_ids
        assert got.token_ids == ar.generate(prompt, max_new_tokens=30).token_ids
        assert got.stats.acceptance_length == want.stats.acceptance_length
    assert session.drafter.context.length == session.cache.length
    resampled = pipe.generate("def add(a, b):", sampling=sampled, max_new_tokens=20)
    assert resampled.token_ids == sync_sampled.token_ids


def test_stacked_mounts_dflash_and_dflash2(ar, tiny_dflash, tiny_dflash2):
    spec = SpecConfig(
        method="stacked", drafter=(str(tiny_dflash), str(tiny_dflash2)), verify_policy="full"
    )
    pipe = ar.with_spec(spec)
    assert set(pipe.method.mounted) == {"dflash", "dflash2"}
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24).token_ids
        assert pipe.generate(prompt, max_new_tokens=24).token_ids == want


@pytest.mark.gpu
def test_cuda_graphs_replay_the_eager_steps(tiny_qwen3_deep, tiny_dflash2):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cuda", dtype="float32")
    eager = ar.with_spec(_spec(tiny_dflash2, trace=True, cuda_graphs=False))
    graphed = ar.with_spec(_spec(tiny_dflash2, trace=True, cuda_graphs=True))
    assert graphed.method.cuda_graphs
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30).token_ids
        a = eager.generate(prompt, max_new_tokens=30)
        b = graphed.generate(prompt, max_new_tokens=30)
        assert a.token_ids == b.token_ids == want
        assert [r["draft"] for r in a.stats.trace] == [r["draft"] for r in b.stats.trace]
    params = SamplingParams(temperature=0.8, seed=3)
    a = eager.generate("The quick brown fox", sampling=params, max_new_tokens=24)
    b = graphed.generate("The quick brown fox", sampling=params, max_new_tokens=24)
    assert a.token_ids == b.token_ids
    torch.cuda.synchronize()
