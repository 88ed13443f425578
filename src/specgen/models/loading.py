"""Load a target decoder from an HF-format directory (config.json + safetensors).

Tensors are streamed one at a time from the (possibly sharded) safetensors files straight
into the model's buffers, cast to the requested dtype on the way, so peak memory is the
model plus one tensor. Every expected tensor must be present with its exact shape;
anything else in the files (rotary caches, extra heads) is ignored.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import safe_open

from specgen.config import ModelArgs
from specgen.errors import CheckpointError
from specgen.models.transformer import DecoderLayer, Transformer


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
        files = sorted(model_dir.glob("*.safetensors"))
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

    def get(self, key: str, device: torch.device) -> torch.Tensor:
        path = self.where[key]
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                return f.get_tensor(key)
        except Exception as e:
            raise CheckpointError(
                f"{self.name}: cannot read tensor {key} from {path.name} ({e})"
            ) from None


Plan = Iterator[tuple[str, torch.Tensor, int]]  # (tensor name, destination, row offset)


def layer_plan(args: ModelArgs, layer: DecoderLayer, prefix: str) -> Plan:
    """The HF tensors of one decoder layer under `prefix` (targets and drafters alike).

    q/k/v and gate/up are stacked row-wise into the fused matrices, hence the offset.
    """
    q_rows = args.num_heads * args.head_dim
    kv_rows = args.num_kv_heads * args.head_dim
    p = prefix
    yield p + "input_layernorm.weight", layer.attn_norm, 0
    yield p + "post_attention_layernorm.weight", layer.ffn_norm, 0
    for kind in ("weight", "bias") if args.qkv_bias else ("weight",):
        dest = layer.wqkv if kind == "weight" else layer.bqkv
        yield p + f"self_attn.q_proj.{kind}", dest, 0
        yield p + f"self_attn.k_proj.{kind}", dest, q_rows
        yield p + f"self_attn.v_proj.{kind}", dest, q_rows + kv_rows
    yield p + "self_attn.o_proj.weight", layer.wo, 0
    if args.o_bias:
        yield p + "self_attn.o_proj.bias", layer.bo, 0
    if args.qk_norm:
        yield p + "self_attn.q_norm.weight", layer.q_norm, 0
        yield p + "self_attn.k_norm.weight", layer.k_norm, 0
    inter = args.intermediate_size
    for kind in ("weight", "bias") if args.mlp_bias else ("weight",):
        dest = layer.w_gate_up if kind == "weight" else layer.b_gate_up
        yield p + f"mlp.gate_proj.{kind}", dest, 0
        yield p + f"mlp.up_proj.{kind}", dest, inter
        down = layer.w_down if kind == "weight" else layer.b_down
        yield p + f"mlp.down_proj.{kind}", down, 0


def _target_plan(args: ModelArgs, model: Transformer) -> Plan:
    yield "model.embed_tokens.weight", model.embed, 0
    yield "model.norm.weight", model.norm, 0
    if not args.tie_word_embeddings:
        yield "lm_head.weight", model.lm_head, 0
    for i, layer in enumerate(model.layers):
        yield from layer_plan(args, layer, f"model.layers.{i}.")


def fill(
    plan: Plan,
    index: SafetensorsIndex,
    shape_of: Callable[[str], tuple[int, ...]],
    device: torch.device,
) -> None:
    """Copy every planned tensor into place; missing or mis-shaped ones fail by name."""
    missing: list[str] = []
    for key, dest, offset in plan:
        if key not in index.where:
            missing.append(key)
            continue
        expected = shape_of(key)
        tensor = index.get(key, device)
        if tuple(tensor.shape) != expected:
            raise CheckpointError(
                f"{index.name}: tensor {key} has shape {tuple(tensor.shape)}, "
                f"expected {expected} for this config"
            )
        dest.data[offset : offset + expected[0]].copy_(tensor)
    if missing:
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(f"{index.name}: checkpoint lacks {', '.join(missing[:3])}{more}")


def load_target(
    model_dir: Path,
    *,
    dtype: torch.dtype,
    device: str,
    name: str | None = None,
) -> Transformer:
    """Build a `Transformer` from `model_dir` and fill it with the checkpoint's weights."""
    name = name or str(model_dir)
    args = ModelArgs.from_hf(read_config(model_dir, name), name=name)
    index = SafetensorsIndex(model_dir, name)
    model = Transformer(args, dtype=dtype, device=device)
    fill(_target_plan(args, model), index, lambda key: shape_for(args, key), model.device)
    return model.eval()


def shape_for(args: ModelArgs, key: str) -> tuple[int, ...]:
    """The shape the HF tensor `key` must have under `args` (for error messages)."""
    h, d, inter = args.hidden_size, args.head_dim, args.intermediate_size
    rows = {
        "q_proj": args.num_heads * d,
        "k_proj": args.num_kv_heads * d,
        "v_proj": args.num_kv_heads * d,
        "o_proj": h,
        "gate_proj": inter,
        "up_proj": inter,
        "down_proj": h,
    }
    leaf = key.split(".")[-2]
    if key.endswith("bias"):
        return (rows[leaf],)
    if leaf in ("q_norm", "k_norm"):
        return (d,)
    if key.endswith("layernorm.weight") or key == "model.norm.weight":
        return (h,)
    if leaf in ("embed_tokens", "lm_head"):
        return (args.vocab_size, h)
    cols = {"o_proj": args.num_heads * d, "down_proj": inter}.get(leaf, h)
    return (rows[leaf], cols)
