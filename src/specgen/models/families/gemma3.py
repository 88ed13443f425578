"""Gemma 3: text backbones (google/gemma-3-270m, -1b, -4b, -12b, -27b) of sliding-window and
global attention layers of one shape, each kind with its own RoPE (local base 10000; the
global base, linearly scaled on the 4B and up), q/k norms, Gemma's 1 + w RMSNorm, four norms
a layer, a GELU MLP, embeddings scaled by sqrt(hidden), attention scaled by
query_pre_attn_scalar ** -0.5, the head tied to the embedding over a 262k vocabulary.

The layer is Gemma 4's (models/layers/gemma4.py) without its v norm and with the scores'
scale; the 1 + w of every norm is added to the weights once after loading (`finish_load`:
fp32 weights, so `(1 + w) * x` is exactly what transformers' Gemma3RMSNorm computes), which
llama.cpp's converter has already done to a GGUF's norms (models/formats/gguf/layouts.py).

Published as text-only `gemma3_text` checkpoints (270M, 1B) and as multimodal `gemma3` ones
(4B and up: a SigLIP vision tower and projector beside the text model). specgen decodes text,
so a multimodal checkpoint runs as its text model and the vision weights are never read (what
someone who runs `llama-cli` on the same GGUF, without its mmproj file, gets). Refused in one
line: bidirectional attention (EmbeddingGemma is an encoder), attention biases, attention
logit softcapping (no Gemma 3 sets it), other activations.

Drafters: the block drafters in z-lab's layout (Qwen3 layers over the target's scaled
embedding and head) and the copy drafters run on it; DeepSpec's Gemma 4 drafters are Gemma
4's layers (refused), and no EAGLE-3 layout is run (its chain embeds through the target's
scaled embedding, which specgen's EAGLE-3 training does not: refused rather than mismatched).

As Gemma 4's, the cache keeps every position of the sliding layers too (rollback and prefix
reuse stay exact); attention reads only the window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specgen.core.config import FULL, SLIDING, ModelArgs, RopeArgs
from specgen.core.errors import CheckpointError
from specgen.models.family import Family, register
from specgen.models.family_config import config_errors, rope_from_hf, token_ids
from specgen.models.layers.gemma4 import GELU, GemmaLayer, GemmaShape
from specgen.models.plans import text_prefix

# transformers' Gemma3TextConfig defaults: published configs omit fields equal to them (the
# 4B's text_config states little more than its sizes)
GEMMA3_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
}
# a Gemma 3 target's fields a drafter of Qwen3 layers must not inherit
DRAFTER_DROPS = frozenset((
    "_sliding_window_pattern", "attn_logit_softcapping", "hidden_activation", "layer_types",
    "query_pre_attn_scalar", "rope_local_base_freq", "rope_scaling", "rope_theta", "sliding_window",
    "sliding_window_pattern", "use_bidirectional_attention",
))  # fmt: skip
# the text model's tensors in a multimodal checkpoint saved before transformers 5
OLD_MULTIMODAL_PREFIX = "language_model.model."


@dataclass(frozen=True)
class Gemma3Args:
    """Which layers slide, over how many keys, and each kind's RoPE (one shape for all)."""

    layer_types: tuple[str, ...]  # per layer: SLIDING or FULL
    sliding_window: int  # a sliding layer's query q sees keys k with q - window < k <= q
    sliding_rope: RopeArgs
    global_rope: RopeArgs
    scale: float  # of the attention scores: query_pre_attn_scalar ** -0.5
    approximate: str = "tanh"  # the MLP's GELU, F.gelu's form (gelu_pytorch_tanh: "tanh")

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    def rope(self, layer: int) -> RopeArgs:
        return self.sliding_rope if self.layer_types[layer] == SLIDING else self.global_rope


class Gemma3(Family):
    name = "gemma3"
    model_types = ("gemma3", "gemma3_text")
    warm_start_refusal = (
        "--init target copies the target's attention layers into the drafter, but this "
        "target's are Gemma 3 layers (four norms, 1 + w scales); use --init random"
    )

    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs:
        return parse_gemma3(cfg, name)

    def layer(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        return GemmaLayer(layer_shape(args), dtype, device)

    def rope(self, args: ModelArgs, index: int) -> tuple[RopeArgs, int]:
        return args.layout.rope(index), args.head_dim

    def window(self, args: ModelArgs, index: int) -> int | None:
        return args.layout.window(index)

    def prefix(self, keys) -> str:
        """`model.` (text-only), `model.language_model.` (multimodal, transformers 5), or
        `language_model.model.` (multimodal as google/gemma-3-4b-it and up were saved)."""
        if OLD_MULTIMODAL_PREFIX + "embed_tokens.weight" in keys:
            return OLD_MULTIMODAL_PREFIX
        return text_prefix(keys)

    def head_key(self, prefix: str) -> str:
        """Beside the text model: `language_model.lm_head.weight` in the older layout."""
        old = prefix == OLD_MULTIMODAL_PREFIX
        return "language_model.lm_head.weight" if old else "lm_head.weight"

    def drafter_config(self, flat: dict[str, Any]) -> dict[str, Any]:
        """Without the Gemma layers' own fields; the global layers' RoPE; the target's
        embedding scale (`input_embedding_scale`, z-lab's field) and final softcapping kept,
        so a drafter drafts as it was trained (through `Transformer.embed_tokens`)."""
        t = {**GEMMA3_DEFAULTS, **flat}
        theta = _ropes(t)[FULL].get("rope_theta", GEMMA3_DEFAULTS["rope_theta"])
        flat = {k: v for k, v in flat.items() if k not in DRAFTER_DROPS}
        flat["input_embedding_scale"] = float(t["hidden_size"]) ** 0.5
        flat["rope_parameters"] = {"rope_type": "default", "rope_theta": theta}
        return flat

    def finish_load(self, model) -> None:
        """Gemma 3's norms scale by 1 + w: added once to every norm's fp32 weight (exactly
        transformers' `1.0 + self.weight.float()`). A GGUF's are stored so (skipped there)."""
        weights = [model.norm]
        for layer in model.layers:
            weights += [layer.attn_norm, layer.post_attn_norm, layer.ffn_norm,
                        layer.post_ffn_norm, layer.q_norm, layer.k_norm]  # fmt: skip
        for w in weights:
            w.data.add_(1.0)

    def kv_bytes(self, args: ModelArgs, context: int, element_size: int) -> int:
        """A sliding layer reads its window only."""
        g = args.layout
        per_layer = 2 * args.num_kv_heads * args.head_dim * element_size
        return sum(per_layer * min(context, g.window(i) or context) for i in range(args.num_layers))


def layer_shape(args: ModelArgs) -> GemmaShape:
    return GemmaShape(
        hidden=args.hidden_size,
        heads=args.num_heads,
        head_dim=args.head_dim,
        kv_heads=args.num_kv_heads,
        intermediate=args.intermediate_size,
        eps=args.rms_norm_eps,
        approximate=args.layout.approximate,
        v_norm=False,
        scalar=False,
        scale=args.layout.scale,
    )


def parse_gemma3(cfg: dict[str, Any], name: str) -> ModelArgs:
    """Gemma 3's text backbone, from a text-only config (`gemma3_text`) or the
    `text_config` of a multimodal one (`gemma3`; its vision tower is never read)."""
    multimodal = cfg.get("model_type") == "gemma3"
    text = cfg.get("text_config", {}) if multimodal else cfg
    if not isinstance(text, dict):
        raise CheckpointError(f"{name}: config.json has a malformed text_config")
    t = {**GEMMA3_DEFAULTS, **text}
    _refuse_gemma3_variants(t, name)
    with config_errors(name):
        scalar = float(t["query_pre_attn_scalar"])
        if scalar <= 0:
            raise CheckpointError(f"{name}: query_pre_attn_scalar {scalar}")
        layout = _gemma3_layers(t, scalar**-0.5, name)
        hidden, heads = int(t["hidden_size"]), int(t["num_attention_heads"])
        kv_heads = int(t["num_key_value_heads"])
        if heads % kv_heads:
            raise CheckpointError(
                f"{name}: {heads} attention heads are not a multiple of {kv_heads} KV heads"
            )
        head_dim = int(t["head_dim"])
        if head_dim % 2:
            raise CheckpointError(f"{name}: head_dim {head_dim} is odd (RoPE pairs channels)")
        tie = (cfg if multimodal and "tie_word_embeddings" in cfg else t)["tie_word_embeddings"]
        cap = t["final_logit_softcapping"]
        eos = cfg.get("eos_token_id") if multimodal and "eos_token_id" in cfg else t["eos_token_id"]
        args = ModelArgs(
            family="gemma3",
            vocab_size=int(t["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(t["intermediate_size"]),
            num_layers=len(layout.layer_types),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(t["rms_norm_eps"]),
            max_positions=int(t["max_position_embeddings"]),
            rope=layout.global_rope,
            tie_word_embeddings=bool(tie),
            qk_norm=True,
            eos_token_ids=token_ids(eos),
            bos_token_id=t["bos_token_id"],
            layout=layout,
            fp32_norms=True,
            embed_scale=hidden**0.5,
            logit_softcap=None if cap is None else float(cap),
        )
    return args


def _refuse_gemma3_variants(t: dict[str, Any], name: str) -> None:
    """What specgen does not build, named in one line each."""
    if t["use_bidirectional_attention"]:
        raise CheckpointError(
            f"{name}: Gemma 3 with bidirectional attention (EmbeddingGemma) is not a decoder"
        )
    if t["attention_bias"]:
        raise CheckpointError(f"{name}: Gemma 3 attention biases are not supported")
    if t["attn_logit_softcapping"] is not None:
        raise CheckpointError(
            f"{name}: Gemma 3 attention logit softcapping (attn_logit_softcapping "
            f"{t['attn_logit_softcapping']}) is not supported; no published Gemma 3 sets it"
        )
    if t["hidden_activation"] not in GELU:
        raise CheckpointError(f"{name}: unsupported activation {t['hidden_activation']!r}")


def _ropes(t: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each layer kind's RoPE parameters: transformers 5 writes `rope_parameters` per layer
    type; older configs say `rope_theta` (global), `rope_local_base_freq` (sliding) and
    `rope_scaling`, which applies to the global layers only."""
    params = t.get("rope_parameters")
    if isinstance(params, dict) and (SLIDING in params or FULL in params):
        full = {"rope_theta": t["rope_theta"], **(params.get(FULL) or {})}
        local = {"rope_theta": t["rope_local_base_freq"], **(params.get(SLIDING) or {})}
        return {FULL: full, SLIDING: local}
    full = {"rope_theta": t["rope_theta"], **(t.get("rope_scaling") or {})}
    return {FULL: full, SLIDING: {"rope_theta": t["rope_local_base_freq"]}}


def _gemma3_layers(t: dict[str, Any], scale: float, name: str) -> Gemma3Args:
    layers = int(t["num_hidden_layers"])
    pattern = int(t["sliding_window_pattern"])
    types = list(
        t.get("layer_types") or [SLIDING if (i + 1) % pattern else FULL for i in range(layers)]
    )
    if len(types) != layers or set(types) - {SLIDING, FULL}:
        raise CheckpointError(
            f"{name}: layer_types must give {SLIDING!r} or {FULL!r} for "
            f"each of the {layers} layers (got {types})"
        )
    window = t["sliding_window"]
    if window is None and SLIDING not in types:
        window = 0  # every layer global: no window to read
    window = int(window)
    if window < 1 and SLIDING in types:
        raise CheckpointError(f"{name}: sliding_window {window}")
    ropes = _ropes(t)
    return Gemma3Args(
        layer_types=tuple(types),
        sliding_window=window,
        sliding_rope=_rope(ropes[SLIDING], SLIDING, name),
        global_rope=_rope(ropes[FULL], FULL, name),
        scale=scale,
        approximate=GELU[t["hidden_activation"]],
    )


def _rope(params: dict[str, Any], kind: str, name: str) -> RopeArgs:
    try:
        return rope_from_hf({"rope_parameters": params}, name)
    except CheckpointError as e:
        raise CheckpointError(f"{e} in Gemma 3's {kind} layers") from None


GEMMA3 = register(Gemma3())
