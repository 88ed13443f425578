"""DeepSpec's Gemma 4 drafters (`Gemma4DSparkModel`: DSpark and its plain block-7 DFlash
checkpoints for `google/gemma-4-12B-it`): their config, read into the shapes of Gemma 4's
own layer (models/layers/gemma4.py), which the drafter's backbone is made of.

Compared with the Qwen3 layers of z-lab's DFlash (models/drafters/dflash.py), every draft layer has
Gemma 4's global-layer shape: `global_head_dim`-wide heads, with `attention_k_eq_v` no
`v_proj` (values are the key projection); RoPE is Gemma's "proportional" form (the first
partial_rotary_factor of each head's frequency pairs rotate, models/layers/rope.py); and the
layer's four norms, GELU MLP and `layer_scalar` (a buffer DeepSpec saves, ones).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgen.core.config import ModelArgs, RopeArgs
from specgen.core.errors import CheckpointError
from specgen.models.layers.gemma4 import GELU, GemmaShape, gemma_mlp_widths

ARCHITECTURES = ("Gemma4DSparkModel",)
TEXT_TYPES = ("gemma4_text", "gemma4_unified_text")


@dataclass(frozen=True)
class GemmaDraftArgs:
    """What Gemma draft layers have beyond the shapes in `DFlashArgs.layers` (whose
    num_kv_heads / head_dim are the attention's: global kv heads, global_head_dim)."""

    k_eq_v: bool  # values are the key projection (no v_proj)
    intermediate: tuple[int, ...]  # per layer (Gemma's double-wide MLP doubles some)
    approximate: str = "tanh"  # the MLP's GELU, F.gelu's form (gelu_pytorch_tanh: "tanh")


def is_gemma_draft(cfg: dict[str, Any]) -> bool:
    """DeepSpec's Gemma draft layout: its architecture, or a Gemma 4 text config."""
    archs = set(cfg.get("architectures") or [])
    return bool(archs & set(ARCHITECTURES)) or cfg.get("model_type") in TEXT_TYPES


def gemma_layers_from_hf(cfg: dict[str, Any], name: str) -> tuple[ModelArgs, GemmaDraftArgs]:
    """The draft layers' shapes from a DeepSpec Gemma draft config (a copy of the target's
    Gemma 4 text config with the drafter's fields written over it, `build_draft_config`)."""
    if cfg.get("enable_moe_block") or cfg.get("num_experts"):
        raise CheckpointError(f"{name}: Gemma 4 draft layers with MoE blocks are not supported")
    if int(cfg.get("hidden_size_per_layer_input") or 0):
        raise CheckpointError(f"{name}: per-layer input embeddings in a drafter are not supported")
    if cfg.get("attention_bias"):
        raise CheckpointError(f"{name}: attention biases in Gemma draft layers are not supported")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in GELU:
        raise CheckpointError(f"{name}: unsupported activation {act!r}")
    try:
        k_eq_v = bool(cfg.get("attention_k_eq_v", False))
        heads = int(cfg["num_attention_heads"])
        kv, d = _attention_shape(cfg, k_eq_v)
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        hidden = int(cfg["hidden_size"])
        rope = _rope(cfg, d, name)
        shared = int(cfg.get("num_kv_shared_layers") or 0)
        wide = bool(cfg.get("use_double_wide_mlp", False))
        args = ModelArgs(
            family="gemma4",
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=d,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_positions=int(cfg.get("max_position_embeddings", 131072)),
            rope=rope,
            fp32_norms=True,  # Gemma scales in fp32 and rounds once
        )
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None
    if heads % kv:
        raise CheckpointError(f"{name}: {heads} attention heads for {kv} key/value heads")
    widths = gemma_mlp_widths(inter, layers, shared, wide)
    return args, GemmaDraftArgs(k_eq_v=k_eq_v, intermediate=widths, approximate=GELU[act])


def _attention_shape(cfg: dict[str, Any], k_eq_v: bool) -> tuple[int, int]:
    """(kv heads, head dim) of the draft attention, DeepSpec's rule: `global_head_dim`, and
    `num_global_key_value_heads` under `attention_k_eq_v`. A config saved by a newer
    transformers gives them per full-attention layer (`per_layer_config`) instead."""
    per_layer = next(iter((cfg.get("per_layer_config") or {}).values()), {})
    d = int(cfg.get("global_head_dim") or per_layer.get("head_dim") or 512)
    if not k_eq_v:
        return int(cfg["num_key_value_heads"]), d
    kv = cfg.get("num_global_key_value_heads") or per_layer.get("num_key_value_heads")
    return int(kv if kv is not None else cfg["num_global_key_value_heads"]), d


def _rope(cfg: dict[str, Any], head_dim: int, name: str) -> RopeArgs:
    """The full-attention RoPE: `rope_parameters["full_attention"]` (Gemma 4 nests one set
    per layer type; DeepSpec's draft layers are all full attention)."""
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention", params)
    kind = full.get("rope_type") or "default"
    theta = float(full.get("rope_theta") or 1_000_000.0)
    if kind == "proportional":
        partial, factor = float(full.get("partial_rotary_factor", 1.0)), full.get("factor", 1)
        return RopeArgs(theta=theta, kind=kind, factor=float(factor), partial=partial)
    if kind == "default" and int(cfg.get("head_dim") or head_dim) == head_dim:
        return RopeArgs(theta=theta)  # transformers' default rope over head_dim
    raise CheckpointError(f"{name}: unsupported RoPE {kind!r} for the draft layers")


def draft_layer_shape(args: ModelArgs, gemma: GemmaDraftArgs, index: int) -> GemmaShape:
    """Draft layer `index`'s shape: the global attention shape, its own MLP width."""
    return GemmaShape(
        hidden=args.hidden_size,
        heads=args.num_heads,
        head_dim=args.head_dim,
        kv_heads=args.num_kv_heads,
        intermediate=gemma.intermediate[index],
        eps=args.rms_norm_eps,
        k_is_v=gemma.k_eq_v,
        approximate=gemma.approximate,
    )
