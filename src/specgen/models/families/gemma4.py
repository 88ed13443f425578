"""Gemma 4: dense text backbones (google/gemma-4-12B-it, -31B) of sliding-window and global
attention layers (models/layers/gemma4.py), each kind with its own head dim, KV heads and
RoPE; KV sharing; embeddings scaled by sqrt(hidden); final logit softcapping.

Published as multimodal checkpoints (`Gemma4ForConditionalGeneration`, or
`Gemma4UnifiedForConditionalGeneration` for the 12B): text under `model.language_model.`,
beside vision and audio towers that are never read. Refused in one line: per-layer input
embeddings (E2B/E4B), MoE blocks (26B-A4B), bidirectional attention, attention biases.

The cache keeps every position of the sliding layers too, not a ring of `window`: rollback
by length and a chat's prefix reuse stay exact for free, and the static (graph-capturable)
path addresses keys by absolute position. The cost is memory: a 12B's sliding layers hold
the whole context instead of 1024 positions; attention still reads only the window (the
eager path slices it, the Triton kernel skips chunks before it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specgen.core.config import FULL, SLIDING, ModelArgs, RopeArgs
from specgen.core.errors import CheckpointError
from specgen.models.cache.kv import StaticKVCache
from specgen.models.family import MultimodalText, register
from specgen.models.family_config import config_errors, token_ids
from specgen.models.layers.gemma4 import GELU, GemmaLayer, GemmaShape, gemma_mlp_widths

# a Gemma 4 target's fields a drafter of Qwen3 layers must not inherit
DRAFTER_DROPS = frozenset((
    "attention_k_eq_v", "audio_config", "enable_moe_block", "global_head_dim",
    "hidden_activation", "hidden_size_per_layer_input", "moe_intermediate_size", "num_experts",
    "num_global_key_value_heads", "num_kv_shared_layers", "per_layer_config", "sliding_window",
    "top_k_experts", "use_bidirectional_attention", "use_double_wide_mlp",
    "vocab_size_per_layer_input",
))  # fmt: skip


@dataclass(frozen=True)
class GemmaArgs:
    """Gemma 4's attention layers, each with its own shape: sliding-window layers and global
    (full) ones differ in head dim, KV heads and RoPE; the last `num_kv_shared_layers`
    layers attend over an earlier layer's keys and values instead of their own."""

    layer_types: tuple[str, ...]  # per layer: SLIDING or FULL
    sliding_window: int  # a sliding layer's query q sees keys k with q - window < k <= q
    head_dims: tuple[int, ...]  # per layer
    kv_heads: tuple[int, ...]  # per layer
    sliding_rope: RopeArgs
    global_rope: RopeArgs  # usually proportional (partial rotary over the whole head)
    kv_source: tuple[int, ...]  # per layer: whose K/V it reads (itself unless shared)
    intermediate_sizes: tuple[int, ...]  # per layer (double-wide MLP on KV-shared layers)
    k_eq_v: bool = False  # global layers: no v_proj, values from the key projection
    approximate: str = "tanh"  # the MLP's GELU: "tanh" (gelu_pytorch_tanh) or "none"

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def rope(self, layer: int) -> RopeArgs:
        return self.sliding_rope if self.layer_types[layer] == SLIDING else self.global_rope

    def shares_kv(self, layer: int) -> bool:
        return self.kv_source[layer] != layer


class Gemma4(MultimodalText):
    name = "gemma4"
    model_types = ("gemma4", "gemma4_text", "gemma4_unified", "gemma4_unified_text")
    warm_start_refusal = (
        "--init target copies the target's attention layers into the drafter, but this "
        "target's are Gemma 4 layers (four norms, their own head dims); use --init random"
    )

    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs:
        return parse_gemma4(cfg, name)

    def drafter_config(self, flat: dict[str, Any]) -> dict[str, Any]:
        """Without the Gemma layers' own fields; of its RoPE per layer type, the global
        layers' theta. The drafter embeds its block as the target does
        (`input_embedding_scale` sqrt(hidden), z-lab's field) and keeps the final logit
        softcapping, so it drafts as it was trained (through `Transformer.embed_tokens`)."""
        flat = {k: v for k, v in flat.items() if k not in DRAFTER_DROPS}
        flat["input_embedding_scale"] = (
            float(flat.get("hidden_size", GEMMA4_DEFAULTS["hidden_size"])) ** 0.5
        )
        params = flat.get("rope_parameters")
        per_type = params if isinstance(params, dict) else {}
        full = per_type.get("full_attention") or {"rope_theta": 1e6}
        theta = full.get("rope_theta", 1e6)
        flat["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        return flat

    def layer(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        return GemmaLayer(layer_shape(args, index), dtype, device)

    def rope(self, args: ModelArgs, index: int) -> tuple[RopeArgs, int]:
        return args.layout.rope(index), args.layout.head_dims[index]

    def window(self, args: ModelArgs, index: int) -> int | None:
        return args.layout.window(index)

    def new_cache(self, args, *, batch, capacity, steps, dtype, device) -> StaticKVCache:
        """One cache slot per layer with K/V of its own, shaped as that layer; a KV-shared
        layer maps to its source layer's slot. Every position is kept (module docstring)."""
        g = args.layout
        own = [i for i in range(args.num_layers) if not g.shares_kv(i)]
        return StaticKVCache(
            num_layers=len(own),
            batch=batch,
            num_kv_heads=[g.kv_heads[i] for i in own],
            head_dim=[g.head_dims[i] for i in own],
            capacity=capacity,
            dtype=dtype,
            device=device,
            slots=[own.index(g.kv_source[i]) for i in range(args.num_layers)],
        )

    def kv_bytes(self, args: ModelArgs, context: int, element_size: int) -> int:
        """Per layer: its shape, and a sliding layer reads its window only."""
        g = args.layout
        return sum(
            2 * g.kv_heads[i] * g.head_dims[i] * element_size
            * min(context, g.window(i) or context)
            for i in range(args.num_layers)
        )  # fmt: skip


def layer_shape(args: ModelArgs, index: int) -> GemmaShape:
    g = args.layout
    shared = g.shares_kv(index)
    return GemmaShape(
        hidden=args.hidden_size,
        heads=args.num_heads,
        head_dim=g.head_dims[index],
        kv_heads=g.kv_heads[index],
        intermediate=g.intermediate_sizes[index],
        eps=args.rms_norm_eps,
        shared=shared,
        k_is_v=g.k_eq_v and g.layer_types[index] == FULL and not shared,
        approximate=g.approximate,
    )


# transformers' Gemma4TextConfig defaults: a config.json may omit any field equal to its
# default (a missing `hidden_size_per_layer_input` means 256: per-layer embeddings)
GEMMA4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_144,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 30,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "global_head_dim": 512,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "attention_bias": False,
    "sliding_window": 512,
    "final_logit_softcapping": None,
    "hidden_size_per_layer_input": 256,
    "attention_k_eq_v": False,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "use_double_wide_mlp": False,
}
# Gemma4UnifiedTextConfig's (google/gemma-4-12B-it): the same layers, other defaults
GEMMA4_UNIFIED_DEFAULTS = {
    **GEMMA4_DEFAULTS,
    "sliding_window": 1024,
    "max_position_embeddings": 262_144,
    "hidden_size_per_layer_input": 0,  # not a field of theirs: no per-layer embeddings
    "use_bidirectional_attention": "vision",
}
GEMMA4_MULTIMODAL = ("gemma4", "gemma4_unified")
GEMMA4_ROPE: dict[str, dict[str, Any]] = {
    SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1e6},
}


def parse_gemma4(cfg: dict[str, Any], name: str) -> ModelArgs:
    """Gemma 4's dense text backbone, from `text_config` of a multimodal checkpoint
    (`gemma4`, or `gemma4_unified` as google/gemma-4-12B-it is published; vision and audio
    weights are never read) or from a text-only config (`gemma4_text`,
    `gemma4_unified_text`). Per-layer input embeddings (E2B/E4B) and MoE blocks (26B-A4B)
    are refused."""
    model_type = str(cfg.get("model_type"))
    multimodal = model_type in GEMMA4_MULTIMODAL
    text = cfg.get("text_config") if multimodal else cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{name}: config.json has a malformed text_config")
    unified = model_type.startswith("gemma4_unified")
    t = {**(GEMMA4_UNIFIED_DEFAULTS if unified else GEMMA4_DEFAULTS), **text}
    _refuse_gemma4_variants(t, name)
    with config_errors(name):
        gemma = _gemma4_layers(t, name)
        hidden, heads = int(t["hidden_size"]), int(t["num_attention_heads"])
        if any(heads % kv for kv in gemma.kv_heads):
            raise CheckpointError(
                f"{name}: {heads} attention heads are not a multiple of "
                f"the KV heads {sorted(set(gemma.kv_heads))}"
            )
        # the flat fields describe the first sliding layer (the most common shape)
        base = gemma.layer_types.index(SLIDING) if SLIDING in gemma.layer_types else 0
        tie = (cfg if multimodal else t).get("tie_word_embeddings", True)
        cap = t["final_logit_softcapping"]
        return ModelArgs(
            family="gemma4",
            vocab_size=int(t["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(t["intermediate_size"]),
            num_layers=len(gemma.layer_types),
            num_heads=heads,
            num_kv_heads=gemma.kv_heads[base],
            head_dim=gemma.head_dims[base],
            rms_norm_eps=float(t["rms_norm_eps"]),
            max_positions=int(t["max_position_embeddings"]),
            rope=gemma.rope(base),
            tie_word_embeddings=bool(tie),
            qk_norm=True,
            eos_token_ids=token_ids(t["eos_token_id"]),
            bos_token_id=t["bos_token_id"],
            layout=gemma,
            fp32_norms=True,
            embed_scale=hidden**0.5,
            logit_softcap=None if cap is None else float(cap),
        )


def _refuse_gemma4_variants(t: dict[str, Any], name: str) -> None:
    """What specgen does not build, named in one line each."""
    if t["enable_moe_block"] or t.get("num_experts"):
        raise CheckpointError(
            f"{name}: Gemma 4 mixture-of-experts targets are not supported (specgen has no "
            "expert layers; enable_moe_block); the dense 12B and 31B run"
        )
    if t["hidden_size_per_layer_input"]:
        raise CheckpointError(
            f"{name}: Gemma 4 per-layer input embeddings (hidden_size_per_layer_input "
            f"{t['hidden_size_per_layer_input']}, the E2B/E4B models) are not supported; "
            "the 12B and 31B run"
        )
    if t["attention_bias"]:
        raise CheckpointError(f"{name}: Gemma 4 attention biases are not supported")
    if t.get("use_bidirectional_attention") == "all":
        raise CheckpointError(f"{name}: Gemma 4 with bidirectional attention is not a decoder")
    if t["hidden_activation"] not in GELU:
        raise CheckpointError(f"{name}: unsupported activation {t['hidden_activation']!r}")


def _gemma4_layers(t: dict[str, Any], name: str) -> GemmaArgs:
    layers = int(t["num_hidden_layers"])
    types = list(
        t.get("layer_types") or [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(layers)]
    )
    if len(types) != layers or set(types) - {SLIDING, FULL}:
        raise CheckpointError(
            f"{name}: layer_types must give {SLIDING!r} or {FULL!r} for "
            f"each of the {layers} layers (got {types})"
        )
    types[-1] = FULL  # as transformers forces it
    overrides = _gemma4_overrides(t, types, name)
    own = [overrides.get(i, {}) for i in range(layers)]
    head_dims = tuple(int(o.get("head_dim", t["head_dim"])) for o in own)
    kv_heads = tuple(int(o.get("num_key_value_heads", t["num_key_value_heads"])) for o in own)
    for kind in set(types):  # RoPE tables are per layer type, as transformers builds them
        dims = {head_dims[i] for i in range(layers) if types[i] == kind}
        if len(dims) > 1 or min(dims) % 2:
            raise CheckpointError(f"{name}: {kind} layers with head dims {sorted(dims)}")
    shared = int(t["num_kv_shared_layers"])
    first = layers - shared  # layers from here on reuse an earlier layer's K/V
    if not 0 <= shared < layers:
        raise CheckpointError(f"{name}: num_kv_shared_layers {shared} of {layers} layers")
    source = list(range(layers))
    for i in range(first, layers):
        producers = [j for j in range(first) if types[j] == types[i]]
        if not producers:
            raise CheckpointError(
                f"{name}: layer {i} reuses the K/V of an earlier {types[i]} "
                f"layer, but none comes before layer {first}"
            )
        source[i] = producers[-1]  # the last unshared layer of its type
    window = int(t["sliding_window"])
    if window < 1:
        raise CheckpointError(f"{name}: sliding_window {window}")
    ropes = t.get("rope_parameters") or GEMMA4_ROPE
    return GemmaArgs(
        layer_types=tuple(types),
        sliding_window=window,
        head_dims=head_dims,
        kv_heads=kv_heads,
        sliding_rope=_gemma4_rope(ropes, SLIDING, name),
        global_rope=_gemma4_rope(ropes, FULL, name),
        kv_source=tuple(source),
        intermediate_sizes=gemma_mlp_widths(
            int(t["intermediate_size"]), layers, shared, bool(t["use_double_wide_mlp"])
        ),
        k_eq_v=bool(t["attention_k_eq_v"]),
        approximate=GELU[t["hidden_activation"]],
    )


def _gemma4_overrides(t: dict[str, Any], types: list[str], name: str) -> dict[int, dict]:
    """Per layer: the head dim and KV heads that differ from the global fields. Published
    configs say `global_head_dim` (and, with `attention_k_eq_v`, `num_global_key_value_heads`)
    for the full-attention layers; transformers 5 writes them back as `per_layer_config`."""
    per_layer = t.get("per_layer_config")
    if per_layer is None:
        full = {"head_dim": t["global_head_dim"]}
        if t["attention_k_eq_v"] and t.get("num_global_key_value_heads") is not None:
            full["num_key_value_heads"] = t["num_global_key_value_heads"]
        return {i: full for i, kind in enumerate(types) if kind == FULL}
    out = {}
    for key, fields in per_layer.items():
        fields = {k: v for k, v in fields.items() if k != "skip" or v}
        unknown = sorted(set(fields) - {"head_dim", "num_key_value_heads"})
        if unknown:
            raise CheckpointError(
                f"{name}: per_layer_config sets {unknown} for layer {key}; "
                "specgen reads only head_dim and num_key_value_heads there"
            )
        out[int(key)] = fields
    return out


def _gemma4_rope(ropes: dict[str, Any], kind: str, name: str) -> RopeArgs:
    params = ropes.get(kind) or GEMMA4_ROPE[kind]
    params = {"rope_theta": GEMMA4_ROPE[kind]["rope_theta"], **params}
    rope_type = params.get("rope_type", "default")
    if rope_type not in ("default", "proportional"):
        raise CheckpointError(f"{name}: unsupported RoPE {rope_type!r} in Gemma 4's {kind} layers")
    if rope_type == "default":  # transformers' default RoPE ignores factor and partial share
        return RopeArgs(theta=float(params["rope_theta"]))
    return RopeArgs(
        theta=float(params["rope_theta"]),
        kind="proportional",
        factor=float(params.get("factor", 1.0)),
        partial=float(params.get("partial_rotary_factor", 1.0)),
    )


GEMMA4 = register(Gemma4())
