"""On an NVIDIA GPU, a Qwen3.5 (hybrid) target: the Triton replay kernel, CUDA graphs and
the device-resident loop keep greedy decoding exactly plain decoding (fp32), and the state
after the resident loop is the state of the committed tokens.

Run by scripts/gpu_check.sh; skipped on machines without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from support.drafters import save_tiny_dflash
from support.targets import TINY_VOCAB

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]


@pytest.fixture(scope="module")
def cuda_q35(tiny_qwen3_5):
    return Pipeline.load(str(tiny_qwen3_5), device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    return save_tiny_dflash(tmp_path_factory.mktemp("q35-gpu") / "d", target_layer_ids=[1, 3],
                            mask_token_id=TINY_VOCAB - 1)  # fmt: skip


@pytest.mark.parametrize("engine", ["sync", "overlap"])
@pytest.mark.parametrize("graphs", [True, False])
def test_hybrid_greedy_on_cuda_equals_ar(cuda_q35, drafter, engine, graphs):
    spec = SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full",
                      engine=engine, cuda_graphs=graphs)  # fmt: skip
    pipe = cuda_q35.with_spec(spec)
    assert pipe.resident_steps == (engine == "overlap")
    for prompt in PROMPTS:
        want = cuda_q35.generate(prompt, max_new_tokens=32, session=cuda_q35.new_session())
        session = pipe.new_session()
        got = pipe.generate(prompt, max_new_tokens=32, session=session)
        assert got.token_ids == want.token_ids
        if graphs:
            assert session.forward.captured > 0
        # and the state left behind is the state of the committed tokens
        fresh = cuda_q35.model.new_cache(256)
        cuda_q35.model(torch.tensor([session.ids], device="cuda"), fresh, num_logits=1)
        for (state, window), (want_state, want_window) in zip(
            session.cache.states(), fresh.states(), strict=True
        ):
            torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
            torch.testing.assert_close(window, want_window, atol=1e-4, rtol=1e-4)


def test_hybrid_cuda_matches_cpu_and_graphs_match_eager(cuda_q35, drafter, tiny_qwen3_5):
    cpu = Pipeline.load(str(tiny_qwen3_5), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full")
    graphed = cuda_q35.with_spec(replace(spec, cuda_graphs=True))
    eager = cuda_q35.with_spec(replace(spec, cuda_graphs=False))
    for prompt in PROMPTS:
        want = cpu.generate(prompt, max_new_tokens=24).token_ids
        assert cuda_q35.generate(prompt, max_new_tokens=24).token_ids == want
        assert graphed.generate(prompt, max_new_tokens=24).token_ids == want
        assert eager.generate(prompt, max_new_tokens=24).token_ids == want
