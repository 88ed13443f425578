"""Hugging Face `config.json` -> `ModelArgs` (`model_args`): the Llama, Qwen2 and Qwen3
families directly; the multimodal families, whose published checkpoints nest the text
backbone's fields in `text_config` beside vision (and audio) towers specgen never reads, by
their own parsers: Qwen3.5 (hybrid Gated DeltaNet + attention) and Gemma 4 (sliding-window
+ global attention).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specgen.config import (
    FAMILIES,
    FULL,
    LINEAR,
    MOE_TYPES,
    SLIDING,
    SUPPORTED_ROPE,
    GemmaArgs,
    HybridArgs,
    ModelArgs,
    RopeArgs,
)
from specgen.errors import CheckpointError


def model_args(cfg: dict[str, Any], *, name: str = "model") -> ModelArgs:
    """A target's `ModelArgs` from its parsed HF config.json; `name` is only used in error
    messages. Unknown keys are ignored; unsupported features (exotic RoPE scaling,
    mixture-of-experts layers, per-layer embeddings) are refused in one line rather than
    silently computed wrong."""
    model_type = cfg.get("model_type")
    if model_type in MOE_TYPES or cfg.get("num_experts"):
        family_name = MOE_TYPES.get(str(model_type), str(model_type))
        raise CheckpointError(
            f"{name}: {family_name} mixture-of-experts targets are not supported (specgen "
            "has no expert layers); the dense models run (e.g. qwen3.5-4b, -9b, -27b)"
        )
    family = FAMILIES.get(str(model_type))
    if family in ("qwen3_5", "gemma4"):
        return (qwen3_5_from_hf if family == "qwen3_5" else gemma4_from_hf)(cfg, name)
    if family is None:
        arch = ", ".join(cfg.get("architectures") or []) or "unknown architecture"
        raise CheckpointError(
            f"{name}: unsupported architecture {model_type!r} ({arch}); "
            f"specgen runs the {', '.join(sorted(FAMILIES))} families"
        )
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise CheckpointError(f"{name}: sliding-window attention targets are not supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise CheckpointError(f"{name}: unsupported activation {cfg.get('hidden_act')!r}")
    try:
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        attention_bias = bool(cfg.get("attention_bias", False))
        return ModelArgs(
            family=family,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_positions=int(cfg.get("max_position_embeddings", 4096)),
            rope=_rope_from_hf(cfg, name),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            # Qwen2 always biases q/k/v (never o); Llama and Qwen3 follow attention_bias.
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=family == "qwen3",
            eos_token_ids=_ids(cfg.get("eos_token_id")),
            bos_token_id=cfg.get("bos_token_id"),
        )
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def _rope_from_hf(cfg: dict[str, Any], name: str) -> RopeArgs:
    # transformers 5 writes `rope_parameters` (theta inside); older configs have
    # `rope_theta` at the top and `rope_scaling` for the scaling variant.
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    merged = {**scaling, **params}
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind not in SUPPORTED_ROPE:
        raise CheckpointError(f"{name}: unsupported RoPE scaling {kind!r}")
    return RopeArgs(
        theta=float(theta),
        kind=kind,
        factor=float(merged.get("factor", 1.0)),
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_positions=int(merged.get("original_max_position_embeddings", 8192)),
    )


def qwen3_5_from_hf(cfg: dict[str, Any], name: str) -> ModelArgs:
    """Qwen3.5's text backbone: from `text_config` of the multimodal checkpoint (the vision
    tower is never read), or from a text-only config."""
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{name}: config.json has a malformed text_config")
    if text.get("num_experts"):
        return model_args({**text, "model_type": "qwen3_5_moe"}, name=name)
    try:
        layers = int(text["num_hidden_layers"])
        types = tuple(text.get("layer_types") or _default_layer_types(text, layers))
        if len(types) != layers or set(types) - {LINEAR, FULL}:
            raise CheckpointError(
                f"{name}: layer_types must give {LINEAR!r} or {FULL!r} for each of the "
                f"{layers} layers (got {list(types)})"
            )
        hybrid = HybridArgs(
            layer_types=types,
            conv_kernel=int(text.get("linear_conv_kernel_dim", 4)),
            key_heads=int(text.get("linear_num_key_heads", 16)),
            value_heads=int(text.get("linear_num_value_heads", 32)),
            key_dim=int(text.get("linear_key_head_dim", 128)),
            value_dim=int(text.get("linear_value_head_dim", 128)),
        )
        if hybrid.value_heads % hybrid.key_heads:
            raise CheckpointError(
                f"{name}: linear_num_value_heads {hybrid.value_heads} is not a multiple of "
                f"linear_num_key_heads {hybrid.key_heads}"
            )
        params = text.get("rope_parameters") or {}
        partial = float(
            params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        )
        base = {**text, "model_type": "qwen3", "rope_parameters": params}
        base.setdefault("head_dim", 256)
        base.setdefault("rope_theta", params.get("rope_theta", 10000.0))
        # the multimodal wrapper decides tying at the top, a text-only config in its own fields
        tie = cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        args = model_args({**base, "tie_word_embeddings": tie}, name=name)
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None
    rotary = int(args.head_dim * partial)
    if rotary % 2 or not 0 < rotary <= args.head_dim:
        raise CheckpointError(
            f"{name}: partial_rotary_factor {partial} gives no usable rotary size"
        )
    eos = args.eos_token_ids or _ids(cfg.get("eos_token_id"))
    return replace(
        args,
        family="qwen3_5",
        hybrid=hybrid,
        attn_output_gate=bool(text.get("attn_output_gate", True)),
        rotary_dim=rotary,
        norm_offset=True,
        eos_token_ids=eos,
    )


def _default_layer_types(text: dict[str, Any], layers: int) -> list[str]:
    """transformers' default: every `full_attention_interval`-th layer is full attention."""
    interval = int(text.get("full_attention_interval", 4))
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]


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
GELU = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}  # hidden_activation -> F.gelu's form


def gemma4_from_hf(cfg: dict[str, Any], name: str) -> ModelArgs:
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
    try:
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
            eos_token_ids=_ids(t["eos_token_id"]),
            bos_token_id=t["bos_token_id"],
            gemma=gemma,
            embed_scale=hidden**0.5,
            logit_softcap=None if cap is None else float(cap),
        )
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None


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


def gemma4_mlp_widths(
    intermediate: int, layers: int, shared: int, double_wide: bool
) -> tuple[int, ...]:
    """Each layer's MLP width, transformers' Gemma4TextMLP rule: the layers at or past
    num_layers - num_kv_shared_layers (when that is > 0) are KV-shared and, under
    `use_double_wide_mlp`, twice as wide."""
    first = layers - shared
    return tuple(intermediate * (2 if double_wide and i >= first > 0 else 1) for i in range(layers))


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
        intermediate_sizes=gemma4_mlp_widths(
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
