"""On an NVIDIA GPU, a Gemma 3 target (sliding and global layers, window 4, scores scaled by
query_pre_attn_scalar ** -0.5): the Triton attention with that window and scale, CUDA
graphs and the device-resident loop keep greedy decoding exactly plain decoding (fp32) with
a DFlash drafter, ngram and both stacked, far past the window; and the answer is the CPU's.

Run by scripts/gpu_check.sh; skipped on machines without CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from support.drafters import save_tiny_dflash

pytestmark = pytest.mark.gpu

PROMPTS = ["The quick brown fox", "def add(a, b):", "one two one two one two"]


@pytest.fixture(scope="module")
def cuda_g3(tiny_gemma3):
    return Pipeline.load(str(tiny_gemma3), device="cuda", dtype="float32")


@pytest.fixture(scope="module")
def dflash(tmp_path_factory):
    return save_tiny_dflash(tmp_path_factory.mktemp("g3-gpu") / "d", target_layer_ids=[1, 3])


SPECS = {
    "dflash": lambda d: SpecConfig(method="dflash", drafter=str(d)),
    "ngram": lambda d: SpecConfig(method="ngram"),
    "stacked": lambda d: SpecConfig(method="stacked", drafter=(str(d), "ngram")),
}


@pytest.mark.parametrize("engine", ["sync", "overlap"])
@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("method", list(SPECS))
def test_gemma3_greedy_on_cuda_equals_ar(cuda_g3, dflash, method, engine, graphs):
    spec = replace(SPECS[method](dflash), verify_policy="full", engine=engine,
                   cuda_graphs=graphs)  # fmt: skip
    pipe = cuda_g3.with_spec(spec)
    for prompt in PROMPTS:
        want = cuda_g3.generate(prompt, max_new_tokens=40, session=cuda_g3.new_session())
        got = pipe.generate(prompt, max_new_tokens=40, session=pipe.new_session())
        assert got.token_ids == want.token_ids


def test_gemma3_cuda_matches_cpu(cuda_g3, tiny_gemma3):
    cpu = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    for prompt in PROMPTS:
        want = cpu.generate(prompt, max_new_tokens=32).token_ids
        assert cuda_g3.generate(prompt, max_new_tokens=32).token_ids == want
