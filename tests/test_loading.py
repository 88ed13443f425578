"""Checkpoint loading: sharded files, and every way a checkpoint can be broken."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from specgen.core.errors import CheckpointError
from specgen.models.loading import load_target
from support.targets import TINY_VOCAB


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def _logits(path):
    model = load_target(path, dtype=torch.float32, device="cpu")
    return model(torch.arange(6).view(1, 6), model.new_cache(8)).logits


def test_sharded_checkpoint_loads_the_same(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "sharded")
    tensors = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half]}
    shards["model-00002-of-00002.safetensors"] = names[half:]
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, path / file)
    index = {"weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))
    torch.testing.assert_close(_logits(path), _logits(tiny_llama))


def test_missing_tensor_is_named(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"lacks model\.layers\.1\.mlp\.up_proj\.weight"):
        load_target(path, dtype=torch.float32, device="cpu")


def test_misshaped_tensor_is_named(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(16, 64)
    save_file(tensors, path / "model.safetensors")
    with pytest.raises(
        CheckpointError, match=r"k_proj\.weight has shape \(16, 64\), expected \(32, 64\)"
    ):
        load_target(path, dtype=torch.float32, device="cpu")


def test_vocab_mismatch_between_config_and_weights(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["vocab_size"] = TINY_VOCAB + 8
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="embed_tokens"):
        load_target(path, dtype=torch.float32, device="cpu")


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_weights_file(tiny_llama, tmp_path, damage):
    path = _copy(tiny_llama, tmp_path / "m")
    weights = path / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(
        b"not a safetensors file" if damage == "garbage" else data[: len(data) // 2]
    )
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_target(path, dtype=torch.float32, device="cpu")


def test_no_weights_and_bad_config(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "m")
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no .safetensors"):
        load_target(path, dtype=torch.float32, device="cpu")
    (path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        load_target(path, dtype=torch.float32, device="cpu")


def test_unsupported_architecture_dir(tiny_llama, tmp_path):
    path = _copy(tiny_llama, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"], cfg["architectures"] = "mamba", ["MambaForCausalLM"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="unsupported architecture 'mamba'"):
        load_target(path, dtype=torch.float32, device="cpu")


def test_a_drafting_load_checks_its_spec_once_and_makes_one_session(
    tiny_qwen3_deep, tiny_dflash, monkeypatch
):
    """`Pipeline.load` with a drafter goes straight from the loaded target to the drafting
    pipeline: the spec is checked at the entry only, and no plain-AR pipeline allocates a
    full-context session on the way (issue 32)."""
    from specgen.api import pipeline as pipeline_module
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig

    checks, sessions = [], []
    real_check, real_session = pipeline_module.checked_spec, pipeline_module.Session
    monkeypatch.setattr(
        pipeline_module, "checked_spec", lambda *a: checks.append(a) or real_check(*a)
    )
    monkeypatch.setattr(
        pipeline_module, "Session", lambda *a, **k: sessions.append(a) or real_session(*a, **k)
    )
    spec = SpecConfig(drafter=str(tiny_dflash), verify_policy="full")  # its kind: dflash
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    assert pipe.spec.method == "dflash" and pipe.method is not None
    assert len(checks) == 1 and len(sessions) == 1
    assert pipe.session.drafter is not None  # the one session is the drafting one
    other = pipe.with_spec(SpecConfig(method="ngram", verify_policy="full"))
    assert len(checks) == 2 and len(sessions) == 2 and other.model is pipe.model


def test_a_pipeline_runs_what_it_is_given_and_never_loads(tiny_llama):
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig
    from specgen.core.errors import SpecgenError

    ar = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    with pytest.raises(SpecgenError, match="loaded draft method"):
        Pipeline(ar.model, ar.codec, ar.name, ar.context, SpecConfig(method="ngram"))
