"""On an NVIDIA GPU: EAGLE-3's draft chains as CUDA graphs draft what the eager chains do
(greedy and seeded sampling), and the device-resident loop with EAGLE-3 (alone and
stacked) makes the sync loop's steps, fp32. Run by scripts/gpu_check.sh; skipped without
CUDA. The same code paths run on the CPU in test_eagle3_engines.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.methods.eagle3.drafter import CHAINS
from support.eagle3 import save_eagle3

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]
SAMPLED = SamplingParams(temperature=1.5, top_k=100, seed=5)


@pytest.fixture(scope="module")
def cuda_ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def eagle3(tmp_path_factory):
    return save_eagle3(tmp_path_factory.mktemp("eagle3") / "d", "specforge", taps=[1, 3, 5])


def _steps(result):
    return [(s["verify_length"], s["accepted"], s["committed"]) for s in result.stats.trace]


def test_eagle3_chains_replay_as_graphs(cuda_ar, eagle3):
    spec = SpecConfig(method="eagle3", drafter=str(eagle3), verify_policy="full", trace=True)
    graphed = cuda_ar.with_spec(replace(spec, cuda_graphs=True, engine="sync"))
    eager = cuda_ar.with_spec(replace(spec, cuda_graphs=False, engine="sync"))
    assert graphed.method.cuda_graphs
    for prompt in PROMPTS:
        for params in (None, SAMPLED):
            session = graphed.new_session()
            got = graphed.generate(prompt, sampling=params, max_new_tokens=32, session=session)
            want = eager.generate(prompt, sampling=params, max_new_tokens=32)
            assert got.token_ids == want.token_ids
            assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
            replays = session.drafter.steps.step(CHAINS).replays
            assert replays and all(r.graph is not None for r in replays)
            if params is None:
                assert got.token_ids == cuda_ar.generate(prompt, max_new_tokens=32).token_ids
    torch.cuda.synchronize()


@pytest.mark.parametrize("stacked", [False, True])
def test_resident_steps_with_eagle3_on_cuda_are_the_sync_steps(
    cuda_ar, eagle3, tiny_dflash, stacked
):
    """Every draft verified whole: the device-resident loop (overlap on CUDA) makes the
    sync loop's steps, greedy and seeded, with EAGLE-3's chains replayed from device state.
    (Stacked's selector learns a step late there: its greedy output is checked only.)"""
    drafter = (str(tiny_dflash), str(eagle3)) if stacked else str(eagle3)
    spec = SpecConfig(
        method="stacked" if stacked else "eagle3", drafter=drafter, verify_policy="full",
        trace=True,
    )  # fmt: skip
    resident = cuda_ar.with_spec(replace(spec, engine="overlap"))
    sync = cuda_ar.with_spec(replace(spec, engine="sync"))
    assert resident.resident_steps and not sync.resident_steps
    for prompt in PROMPTS:
        for params in (None,) if stacked else (None, SAMPLED):
            session = resident.new_session()
            got = resident.generate(prompt, sampling=params, max_new_tokens=32, session=session)
            want = sync.generate(
                prompt, sampling=params, max_new_tokens=32, session=sync.new_session()
            )
            assert got.token_ids == want.token_ids
            if not stacked:
                assert _steps(got) == _steps(want)
                assert all(r.graph is not None for r in session.drafter.steps.step(CHAINS).replays)
            assert session.forward.captured > 0
        want = cuda_ar.generate(prompt, max_new_tokens=32, session=cuda_ar.new_session())
        assert resident.generate(prompt, max_new_tokens=32).token_ids == want.token_ids


def test_deepspecs_gemma_drafter_on_cuda(tiny_gemma4, tmp_path):
    """DeepSpec's Gemma 4 EAGLE-3 on the tiny Gemma 4: the resident loop with its chains as
    graphs makes the eager sync loop's steps, greedy (AR's output) and seeded."""
    from support.gemma4_drafters import save_deepspec_eagle3

    drafter = save_deepspec_eagle3(tmp_path / "g", tiny_gemma4)
    ar = Pipeline.load(str(tiny_gemma4), device="cuda", dtype="float32")
    spec = SpecConfig(method="eagle3", drafter=str(drafter), verify_policy="full", trace=True)
    fast = ar.with_spec(replace(spec, cuda_graphs=True, engine="overlap"))
    plain = ar.with_spec(replace(spec, cuda_graphs=False, engine="sync"))
    assert fast.resident_steps and fast.method.cuda_graphs
    for prompt in PROMPTS:
        for params in (None, SAMPLED):
            session = fast.new_session()
            got = fast.generate(prompt, sampling=params, max_new_tokens=24, session=session)
            want = plain.generate(
                prompt, sampling=params, max_new_tokens=24, session=plain.new_session()
            )
            assert got.token_ids == want.token_ids and _steps(got) == _steps(want)
            assert all(r.graph is not None for r in session.drafter.steps.step(CHAINS).replays)
        greedy = fast.generate(prompt, max_new_tokens=24, session=fast.new_session())
        want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session())
        assert greedy.token_ids == want.token_ids
