"""On an NVIDIA GPU: penalties and logprobs through the CUDA paths (the device-resident
loop, CUDA graphs, the Triton verify kernel) are the CPU's plain decoding (fp32).

Run by scripts/gpu_check.sh; skipped on machines without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "one two one two one two"]
PENALTIES = dict(repetition_penalty=1.3, frequency_penalty=-0.8, presence_penalty=0.4)


@pytest.fixture(scope="module")
def both(tiny_qwen3_deep):
    cpu = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    cuda = Pipeline.load(str(tiny_qwen3_deep), device="cuda", dtype="float32")
    return cpu, cuda


def _run(pipe, prompt, params, n=24):
    out = pipe.generate(prompt, sampling=params, max_new_tokens=n, session=pipe.new_session())
    return out.token_ids, out.logprobs


@pytest.mark.parametrize("name", ["ar", "dflash", "dspark", "stacked"])
@pytest.mark.parametrize("engine", ["sync", "overlap"])  # overlap: the resident loop
def test_penalised_greedy_and_logprobs_on_cuda_are_the_cpu_s(
    both, tiny_dflash, tiny_dspark, name, engine
):
    cpu, cuda = both
    drafter = {"ar": None, "dflash": str(tiny_dflash), "dspark": str(tiny_dspark),
               "stacked": (str(tiny_dflash), str(tiny_dspark))}[name]  # fmt: skip
    pipe = cuda.with_spec(SpecConfig(method=name, drafter=drafter, verify_policy="full",
                                     engine=engine))  # fmt: skip
    if name != "ar":
        assert pipe.resident_steps == (engine == "overlap")
    params = SamplingParams(logprobs=4, **PENALTIES)
    for prompt in PROMPTS:
        want_ids, want = _run(cpu, prompt, params)
        got_ids, got = _run(pipe, prompt, params)
        assert got_ids == want_ids
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=1e-4)
            assert [i for i, _ in a.top] == [i for i, _ in b.top]


@pytest.mark.parametrize("name", ["dflash", "dspark"])
def test_seeded_penalised_sampling_resident_is_the_sync_loop_s(
    both, tiny_dflash, tiny_dspark, name
):
    _, cuda = both
    drafter = str(tiny_dflash if name == "dflash" else tiny_dspark)
    spec = SpecConfig(method=name, drafter=drafter, verify_policy="full")
    resident = cuda.with_spec(replace(spec, engine="overlap"))
    sync = cuda.with_spec(replace(spec, engine="sync"))
    params = SamplingParams(temperature=0.8, top_k=20, seed=7, logprobs=2, **PENALTIES)
    for prompt in PROMPTS:
        a, la = _run(resident, prompt, params)
        b, lb = _run(sync, prompt, params)
        assert a == b
        assert [x.logprob for x in la] == pytest.approx([x.logprob for x in lb], abs=1e-4)


def test_prompt_logprobs_on_cuda_are_the_cpu_s(both):
    cpu, cuda = both
    for prompt in PROMPTS:
        ids = cpu.encode(prompt, raw=True)
        want = cpu.prompt_logprobs(ids, top=3, session=cpu.new_session())
        got = cuda.prompt_logprobs(ids, top=3, session=cuda.new_session())
        assert [g.token for g in got] == [w.token for w in want]
        assert [g.logprob for g in got] == pytest.approx([w.logprob for w in want], abs=1e-4)
