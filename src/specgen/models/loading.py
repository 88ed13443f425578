"""Load a target decoder from an HF-format directory (config.json + safetensors).

Which tensor fills which weight is each model's and layer's load plan (models/plans.Row).

Tensors are streamed one at a time from the (possibly sharded) safetensors files straight
into the model's buffers, cast to the requested dtype on the way, so peak memory is the
model plus one tensor. Every expected tensor must be present with its exact shape;
anything else in the files (rotary caches, extra heads) is ignored.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from specgen.core.errors import CheckpointError
from specgen.models.families import model_args
from specgen.models.plans import Plan
from specgen.models.transformer import Transformer


def read_config(model_dir: Path, name: str) -> dict:
    path = model_dir / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{name}: no config.json in {model_dir}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{name}: config.json is not valid JSON ({e})") from None


class SafetensorsIndex:
    """Maps tensor names to the safetensors file that holds them (sharded or not)."""

    def __init__(self, model_dir: Path, name: str) -> None:
        self.name = name
        self.where: dict[str, Path] = {}
        # a directory's files, or one file (a head kept apart: an MTP-only file)
        files = [model_dir] if model_dir.is_file() else sorted(model_dir.glob("*.safetensors"))
        if not files:
            raise CheckpointError(f"{name}: no .safetensors weights in {model_dir}")
        for f in files:
            for key in self._keys(f):
                self.where[key] = f

    def _keys(self, path: Path) -> list[str]:
        try:
            with safe_open(str(path), framework="pt") as f:
                return list(f.keys())
        except Exception as e:  # safetensors raises its own error types for a bad header
            raise CheckpointError(f"{self.name}: corrupt weights file {path.name} ({e})") from None

    def shape(self, key: str) -> tuple[int, ...]:
        """A tensor's shape, read from the header only."""
        try:
            with safe_open(str(self.where[key]), framework="pt") as f:
                return tuple(f.get_slice(key).get_shape())
        except Exception as e:
            raise CheckpointError(f"{self.name}: cannot read tensor {key} ({e})") from None

    def label(self, key: str) -> str:  # how messages name a tensor
        return key

    def get(self, key: str, device: torch.device) -> torch.Tensor:
        path = self.where[key]
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                return f.get_tensor(key)
        except Exception as e:
            raise CheckpointError(
                f"{self.name}: cannot read tensor {key} from {path.name} ({e})"
            ) from None


def fill(plan: Plan, index: SafetensorsIndex, device: torch.device) -> None:
    """Copy every planned tensor into place; missing or mis-shaped ones fail by name (an
    optional row that the checkpoint lacks keeps its initial value)."""
    missing: list[str] = []
    for row in plan:
        if row.key not in index.where:
            if not row.optional:
                missing.append(row.key)
            continue
        tensor = index.get(row.key, device)
        if tuple(tensor.shape) != row.shape:
            raise CheckpointError(
                f"{index.name}: tensor {index.label(row.key)} has shape "
                f"{tuple(tensor.shape)}, expected {row.shape} for this config"
            )
        row.load(tensor)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        names = ", ".join(index.label(k) for k in missing[:3])
        raise CheckpointError(f"{index.name}: checkpoint lacks {names}{more}")


def load_target(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    device: str,
    name: str | None = None,
) -> Transformer:
    """Build a `Transformer` from `model_dir` and fill it with the checkpoint's weights."""
    name = name or str(model_dir)
    args = model_args(read_config(model_dir, name), name=name)
    index = SafetensorsIndex(model_dir, name)
    model = Transformer(args, dtype=dtype, device=device)
    fill(model.plan(model.family.prefix(index.where)), index, model.device)
    model.family.finish_load(model)
    model.source = model_dir
    return model.eval()


def load_gguf_target(
    gguf_path: Path,
    config_dir: Path,
    *,
    dtype: torch.dtype,
    device: str,
    name: str | None = None,
    dequantize: bool = False,
) -> Transformer:
    """A `Transformer` whose matrices stay in the GGUF file's quantization (packed weights;
    models/formats/packed_weight.py), with its config from `config_dir`
    (models/formats/gguf/convert.py); with `dequantize`, the same matrices dequantized to
    `dtype` (dense weights)."""
    from specgen.models.formats.gguf.index import GGUFIndex
    from specgen.models.formats.packed_weight import PackedWeight
    from specgen.models.formats.weights import DenseWeight, replace_weights, storage_changed

    name = name or str(gguf_path)
    args = model_args(read_config(config_dir, name), name=name)
    index = GGUFIndex(gguf_path, name, args)
    # the dense matrices this builds are never written (their pages never become resident)
    # and are dropped for empty packed ones, which the plan then fills
    model = Transformer(args, dtype=dtype, device=device)
    replace_weights(model, lambda w: PackedWeight(*w.shape, dtype=w.dtype, device=w.device))
    fill(model.plan(model.family.prefix(index.where)), index, model.device)
    unfilled = [
        n
        for n, m in model.named_modules()
        if isinstance(m, PackedWeight) and sum(s.shape[0] for s in m.segments) != m.shape[0]
    ]
    if unfilled:
        raise CheckpointError(f"{name}: the GGUF file does not fill {unfilled[0]}")
    if not index.finished:  # (Qwen3.5's converter stores its norms and decays finished)
        model.family.finish_load(model)
    if dequantize:
        made: dict[int, DenseWeight] = {}  # a tied head stays the embedding
        for parent in list(model.modules()):
            for child_name, child in list(parent._modules.items()):
                if isinstance(child, PackedWeight):
                    if id(child) not in made:
                        made[id(child)] = dense = DenseWeight(*child.shape, dtype=dtype,
                                                              device=child.device)  # fmt: skip
                        dense.weight.data.copy_(child.dense())
                    setattr(parent, child_name, made[id(child)])
        storage_changed()
    model.source = gguf_path
    return model.eval()
