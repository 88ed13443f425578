"""On a machine with a GPU the kernel backend is Triton for the whole process, yet a
pipeline loaded with `--device cpu` must still run: Triton cannot launch on host memory, so
every dispatcher picks its kernel by where the tensors live, not by the backend alone.

Here the GPU machine's setting is imitated on the CPU: the backend reads "triton" and every
Triton entry point refuses to run."""

from __future__ import annotations

import importlib

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig

DISPATCHERS = (
    "specgen.kernels.verify",
    "specgen.kernels.block_attention",
    "specgen.kernels.rmsnorm",
    "specgen.kernels.qk_rope",
    "specgen.methods.dspark.drafter",
)


def _refuse(*args, **kwargs):
    raise AssertionError("a Triton kernel was launched on CPU tensors")


@pytest.fixture
def triton_backend(monkeypatch):
    for name in DISPATCHERS:
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "backend", lambda: "triton")
        for attr in dir(module):
            if attr.endswith("_triton") and callable(getattr(module, attr)):
                monkeypatch.setattr(module, attr, _refuse)


@pytest.mark.parametrize("method", ["dflash", "dspark"])
def test_a_cpu_pipeline_never_launches_triton(
    triton_backend, tiny_qwen3_deep, tiny_dflash, tiny_dspark, method
):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    drafter = str(tiny_dflash if method == "dflash" else tiny_dspark)
    pipe = ar.with_spec(SpecConfig(method=method, drafter=drafter))
    want = ar.generate("The quick brown fox", max_new_tokens=20, session=ar.new_session())
    got = pipe.generate("The quick brown fox", max_new_tokens=20, session=pipe.new_session())
    assert got.token_ids == want.token_ids
