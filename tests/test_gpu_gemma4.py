"""On an NVIDIA GPU, a Gemma 4 target (sliding and global layers, window 4): the Triton
attention with a window and score scale 1, CUDA graphs and the device-resident loop keep
greedy decoding exactly plain decoding (fp32) with DeepSpec's DSpark drafter, z-lab's
DFlash drafter and both stacked, far past the window.

Run by scripts/gpu_check.sh; skipped on machines without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from support.gemma4_drafters import save_deepspec_drafter, save_zlab_gemma_drafter

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]


@pytest.fixture(scope="module")
def cuda_g4(tiny_gemma4):
    return Pipeline.load(str(tiny_gemma4), device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def drafters(tiny_gemma4, tmp_path_factory):
    root = tmp_path_factory.mktemp("g4-gpu")
    return {
        "dspark": save_deepspec_drafter(root / "dspark", tiny_gemma4),
        "dflash": save_zlab_gemma_drafter(root / "dflash", tiny_gemma4),
    }


SPECS = {
    "dspark": lambda d: SpecConfig(method="dspark", drafter=str(d["dspark"])),
    "dflash": lambda d: SpecConfig(method="dflash", drafter=str(d["dflash"])),
    "stacked": lambda d: SpecConfig(method="stacked", drafter=(str(d["dflash"]), str(d["dspark"]))),
}


@pytest.mark.parametrize("engine", ["sync", "overlap"])
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("method", list(SPECS))
def test_gemma_greedy_on_cuda_equals_ar(cuda_g4, drafters, method, engine, graphs):
    spec = replace(SPECS[method](drafters), verify_policy="full", engine=engine,
                   cuda_graphs=graphs)  # fmt: skip
    pipe = cuda_g4.with_spec(spec)
    for prompt in PROMPTS:
        want = cuda_g4.generate(prompt, max_new_tokens=40, session=cuda_g4.new_session())
        session = pipe.new_session()
        got = pipe.generate(prompt, max_new_tokens=40, session=session)
        assert got.token_ids == want.token_ids
        if graphs:
            assert session.forward.captured > 0


def test_gemma_cuda_matches_cpu(cuda_g4, tiny_gemma4):
    cpu = Pipeline.load(str(tiny_gemma4), device="cpu", dtype="float32")
    for prompt in PROMPTS:
        want = cpu.generate(prompt, max_new_tokens=32).token_ids
        assert cuda_g4.generate(prompt, max_new_tokens=32).token_ids == want
