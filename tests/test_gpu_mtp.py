"""On an NVIDIA GPU: the MTP draft chains as CUDA graphs draft what the eager chains do
(greedy and seeded sampling), and the device-resident loop with MTP makes the sync loop's
steps, fp32, on a tiny Qwen3.5 carrying MTP weights. Run by scripts/gpu_check.sh; skipped
without CUDA. The same code paths run on the CPU in test_mtp.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.methods.mtp.drafter import CHAINS
from support.targets import save_tiny_qwen3_5

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]
SAMPLED = SamplingParams(temperature=1.5, top_k=100, seed=5)
SPEC = SpecConfig(method="mtp", verify_policy="full", draft_tokens=4, trace=True)


@pytest.fixture(scope="module")
def cuda_ar(tmp_path_factory):
    path = tmp_path_factory.mktemp("mtp-echo") / "t"
    save_tiny_qwen3_5(path, seed=3, mtp_layers=1, echo=0.01)
    return Pipeline.load(str(path), device="cuda", dtype="float32")


def test_mtp_chains_replay_as_graphs(cuda_ar):
    graphed = cuda_ar.with_spec(replace(SPEC, cuda_graphs=True, engine="sync"))
    eager = cuda_ar.with_spec(replace(SPEC, cuda_graphs=False, engine="sync"))
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


def test_resident_steps_with_mtp_on_cuda_are_the_sync_steps(cuda_ar):
    resident = cuda_ar.with_spec(replace(SPEC, engine="overlap"))
    sync = cuda_ar.with_spec(replace(SPEC, engine="sync"))
    assert resident.resident_steps and not sync.resident_steps
    for prompt in PROMPTS:
        for params in (None, SAMPLED):
            got = resident.generate(prompt, sampling=params, max_new_tokens=32,
                                    session=resident.new_session())  # fmt: skip
            want = sync.generate(prompt, sampling=params, max_new_tokens=32,
                                 session=sync.new_session())  # fmt: skip
            assert got.token_ids == want.token_ids
            assert got.stats.acceptance_length == want.stats.acceptance_length
