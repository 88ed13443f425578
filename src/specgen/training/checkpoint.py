"""Write trained drafters in the public formats, so `--drafter DIR` and other engines load
them: the block backbone's config in z-lab's layout, with the fields a method's hooks add
(`DFlashDraftModel`'s, or DeepSpec's `Qwen3DSparkModel`'s without its copies of the
target's embedding and LM head, which every loader can take from the target). The tensors
are the drafter's load plan read backwards (models/plans.Row), so fused matrices split back
into the HF tensor names the loader reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

import specgen.models.families  # noqa: F401  (registers the families)
from specgen.core.config import RopeArgs
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.family import family_for_config


def _rope_config(rope: RopeArgs) -> dict[str, Any]:
    out: dict[str, Any] = {"rope_type": rope.kind, "rope_theta": rope.theta}
    if rope.kind != "default":
        out["factor"] = rope.factor
    if rope.kind == "llama3":
        out.update(
            low_freq_factor=rope.low_freq_factor,
            high_freq_factor=rope.high_freq_factor,
            original_max_position_embeddings=rope.original_max_positions,
        )
    return out


# fields of layers a drafter's plain attention layers never have, whatever the target:
# recurrent layers' and their pattern, output gates, partial rotary, MTP layers
PLAIN_ATTENTION_DROPS = (
    "attn_output_gate",
    "full_attention_interval",
    "layer_types",
    "mamba_ssm_dtype",
    "mtp_num_hidden_layers",
    "mtp_use_dedicated_embeddings",
    "partial_rotary_factor",
)


def text_config(target_config: dict[str, Any]) -> dict[str, Any]:
    """The target's text fields, flat, as a drafter's config starts from them: a multimodal
    checkpoint's `text_config` (Qwen3.5, Gemma 4), without the fields of layers a drafter
    does not have (`PLAIN_ATTENTION_DROPS`, and what the target's family names in
    `Family.drafter_config`), and RoPE as the drafter's plain attention uses it (no partial
    rotary, no multimodal sections: z-lab's Qwen3.5 drafters rotate whole heads)."""
    flat = {**target_config, **(target_config.get("text_config") or {})}
    for key in ("text_config", "vision_config", *PLAIN_ATTENTION_DROPS):
        flat.pop(key, None)
    flat = {k: v for k, v in flat.items() if not k.startswith("linear_")}
    family = family_for_config(target_config)
    if family is not None:
        flat = family.drafter_config(flat)
    params = flat.get("rope_parameters")
    if isinstance(params, dict):
        flat["rope_parameters"] = {
            k: v
            for k, v in params.items()
            if k not in ("partial_rotary_factor", "mrope_section", "mrope_interleaved")  # fmt: skip
        }
    return flat


def _base_config(target_config: dict[str, Any], net: DFlashNet) -> dict[str, Any]:
    """The target's config with every field of the drafter's own shape written over it
    (its RoPE and windows can differ from the target's: they are the drafter's)."""
    la, args = net.args.layers, net.args
    sliding = [w for w in args.windows if w is not None]
    text = text_config(target_config)
    base = {k: v for k, v in text.items() if k not in ("rope_scaling", "rope_theta")}
    return {
        **base,
        "num_hidden_layers": la.num_layers,
        "hidden_size": la.hidden_size,
        "intermediate_size": la.intermediate_size,
        "num_attention_heads": la.num_heads,
        "num_key_value_heads": la.num_kv_heads,
        "head_dim": la.head_dim,
        "rms_norm_eps": la.rms_norm_eps,
        "rope_parameters": _rope_config(la.rope),
        "layer_types": [
            "full_attention" if w is None else "sliding_attention" for w in args.windows
        ],
        "sliding_window": sliding[0] if sliding else None,
        "use_sliding_window": bool(sliding),
        "block_size": args.block_size,
        "num_target_layers": args.num_target_layers,
        "tie_word_embeddings": False,
        "model_type": "qwen3",
        **({} if args.is_causal is None else {"is_causal": args.is_causal}),
    }


def save_drafter(
    path: Path,
    net: torch.nn.Module,
    backbone: DFlashNet,
    target_config: dict[str, Any],
    fields: dict[str, Any],
    *,
    dtype: torch.dtype = torch.bfloat16,
) -> Path:
    """Write config.json + model.safetensors for `net` (whose block backbone is `backbone`)
    into `path` (created); `fields`: the config fields that name its layout."""
    config = {**_base_config(target_config, backbone), **fields}
    tensors = {row.key: row.read() for row in net.plan()}
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    weights = {k: v.detach().to(dtype).contiguous().cpu() for k, v in tensors.items()}
    save_file(weights, str(path / "model.safetensors"))
    return path
