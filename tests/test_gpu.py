"""On an NVIDIA GPU: every method stays exactly lossless (fp32) and the engines agree.

Run by scripts/gpu_check.sh; skipped on machines without CUDA."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.models.graphs import GREEDY

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]


@pytest.fixture(scope="module")
def cuda_ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cuda", dtype="float32")


def _specs(tiny_dflash, tiny_dspark):
    return {
        "ngram": SpecConfig(method="ngram"),
        "dflash": SpecConfig(method="dflash", drafter=str(tiny_dflash)),
        "dspark": SpecConfig(method="dspark", drafter=str(tiny_dspark)),
        "stacked": SpecConfig(method="stacked", drafter=(str(tiny_dflash), str(tiny_dspark))),
    }


@pytest.mark.parametrize("name", ["ngram", "dflash", "dspark", "stacked"])
@pytest.mark.parametrize("engine", ["sync", "overlap"])
def test_greedy_on_cuda_equals_ar(cuda_ar, tiny_dflash, tiny_dspark, name, engine):
    from dataclasses import replace

    spec = replace(_specs(tiny_dflash, tiny_dspark)[name], engine=engine)
    pipe = cuda_ar.with_spec(spec)
    assert pipe.model.device.type == "cuda"
    for prompt in PROMPTS:
        want = cuda_ar.generate(prompt, max_new_tokens=32, session=cuda_ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=32, session=pipe.new_session())
        assert got.token_ids == want.token_ids


def test_cuda_matches_cpu_in_fp32(cuda_ar, tiny_qwen3_deep):
    cpu = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    for prompt in PROMPTS:
        assert (
            cuda_ar.generate(prompt, max_new_tokens=24).token_ids
            == cpu.generate(prompt, max_new_tokens=24).token_ids
        )


@pytest.mark.parametrize("top_k", [20, 0])  # 0: temperature only, the Triton Markov draw
def test_seeded_sampling_is_reproducible_on_cuda(cuda_ar, tiny_dspark, top_k):
    pipe = cuda_ar.with_spec(SpecConfig(method="dspark", drafter=str(tiny_dspark)))
    params = SamplingParams(temperature=0.8, top_k=top_k, seed=3)
    a = pipe.generate("The quick brown fox", sampling=params, max_new_tokens=24)
    b = pipe.generate("The quick brown fox", sampling=params, max_new_tokens=24)
    assert a.token_ids == b.token_ids
    assert torch.cuda.is_available()


@pytest.mark.parametrize("name", ["ar", "dflash", "dspark"])
def test_cuda_graphs_replay_the_eager_steps(cuda_ar, tiny_dflash, tiny_dspark, name):
    from dataclasses import replace

    spec = SpecConfig() if name == "ar" else _specs(tiny_dflash, tiny_dspark)[name]
    spec = replace(spec, verify_policy="full")  # every step drafts: the draft graphs run
    graphed = cuda_ar.with_spec(replace(spec, cuda_graphs=True))
    eager = cuda_ar.with_spec(replace(spec, cuda_graphs=False))
    for prompt in PROMPTS:
        session = graphed.new_session()
        got = graphed.generate(prompt, max_new_tokens=32, session=session)
        want = eager.generate(prompt, max_new_tokens=32, session=eager.new_session())
        assert got.token_ids == want.token_ids
        assert session.forward.captured > 0  # the steps really ran as graphs
        if name != "ar":  # and so did the draft step
            assert session.drafter.steps.step(GREEDY)._replay.graph is not None
    if name == "dspark":  # a sampled draft step is a graph too, and draws as the eager one
        params = SamplingParams(temperature=0.8, top_k=20, seed=7)
        session = graphed.new_session()
        got = graphed.generate(PROMPTS[0], sampling=params, max_new_tokens=32, session=session)
        want = eager.generate(PROMPTS[0], sampling=params, max_new_tokens=32)
        assert got.token_ids == want.token_ids
        steps = session.drafter.steps
        (step,) = [steps.step(k) for k in steps.keys() if k != GREEDY]
        assert step._replay.graph is not None
    assert eager.new_session().forward is eager.model


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_resident_steps_on_cuda_are_the_sync_steps(cuda_ar, tiny_dflash, tiny_dspark, name):
    """Every draft verified whole: the device-resident loop (overlap on CUDA) makes the
    sync loop's steps, greedy and seeded, with the graphs replayed from device state.
    (Stacked's selector learns a step late there; its greedy output is checked above.)"""
    from dataclasses import replace

    spec = replace(_specs(tiny_dflash, tiny_dspark)[name], verify_policy="full", trace=True)
    resident = cuda_ar.with_spec(replace(spec, engine="overlap"))
    sync = cuda_ar.with_spec(replace(spec, engine="sync"))
    assert resident.resident_steps and not sync.resident_steps

    def steps(result):
        return [(s["verify_length"], s["accepted"], s["committed"]) for s in result.stats.trace]

    sampled = SamplingParams(temperature=0.8, top_k=20, seed=5)
    for prompt in PROMPTS:
        for params in (None, sampled):
            session = resident.new_session()
            got = resident.generate(prompt, sampling=params, max_new_tokens=32, session=session)
            want = sync.generate(
                prompt, sampling=params, max_new_tokens=32, session=sync.new_session()
            )
            assert got.token_ids == want.token_ids and steps(got) == steps(want)
            assert session.forward.captured > 0


def test_eager_attention_skips_cudnn():
    """cuDNN's SDPA plans per key length (~1 ms of host time per layer per decoding step
    on an H200): the eager path must pick another fused kernel, with the same result."""
    from specgen.kernels.attention import attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 8, 1, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, 2, 517, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, 2, 517, 128, device="cuda", dtype=torch.bfloat16, generator=gen)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        out = attention(q, k, v, None, False)
        torch.cuda.synchronize()
    names = [e.key.lower() for e in prof.key_averages()]
    assert not any("cudnn" in n for n in names), names
    kv = k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1)
    want = torch.softmax((q.float() @ kv[0].float().transpose(-1, -2)) / 128**0.5, -1)
    torch.testing.assert_close(out.float(), want @ kv[1].float(), atol=2e-2, rtol=2e-2)


def test_verify_costs_replay_the_step_graphs(cuda_ar, monkeypatch):
    """With graphs on, the verify costs are timed as the graph replays a session runs."""
    from specgen.engine.costs import measure_costs
    from specgen.models import graphs as cuda_graphs

    replays = []
    real = cuda_graphs.GraphedForward.__call__

    def counted(self, *args, **kwargs):
        out = real(self, *args, **kwargs)
        replays.append(self.captured)
        return out

    monkeypatch.setattr(cuda_graphs.GraphedForward, "__call__", counted)
    table = measure_costs(cuda_ar.model, 3, contexts=(16,), repeats=2, graphs=True)
    assert table.max_drafts == 3 and all(s > 0 for s in table.seconds[0])
    assert replays and replays[-1] == 4  # one graph per block size, 1..4 tokens


@pytest.mark.parametrize("name", ["ngram", "dflash", "stacked"])
def test_answers_at_once_on_cuda_are_each_as_alone(cuda_ar, tiny_dflash, tiny_dspark, name):
    """Streams on CUDA: each answer's rows through its own session's CUDA graphs, greedy
    as any engine alone, seeded as the sync loop alone."""
    from dataclasses import replace

    from specgen.api.streams import generate_many

    pipe = cuda_ar.with_spec(replace(_specs(tiny_dflash, tiny_dspark)[name], engine="sync"))
    for sampling in (None, SamplingParams(temperature=0.8, seed=7)):
        want = [pipe.generate(p, sampling=sampling, max_new_tokens=24,
                              session=pipe.new_session()).token_ids for p in PROMPTS]  # fmt: skip
        got = generate_many(pipe, PROMPTS, parallel=2, sampling=sampling, max_new_tokens=24)
        assert [c.token_ids for c in got] == want
