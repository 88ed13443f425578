"""Qwen3.5: hybrid targets, Gated DeltaNet layers (models/layers/gated_deltanet.py) between gated
attention layers (the Llama-shaped layer with a sigmoid output gate and partial RoPE),
zero-centred norms, and a cache whose recurrent state rolls back (models/cache/hybrid.py).

Published checkpoints are the multimodal `Qwen3_5ForConditionalGeneration`: the text
backbone under `model.language_model.`, beside a vision tower (`model.visual.*`) and a
multi-token-prediction head (`mtp.*`) that text generation never reads; a text-only save
(`Qwen3_5ForCausalLM`) has it under `model.`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from specgen.core.config import FULL, LINEAR, ModelArgs
from specgen.core.errors import CheckpointError
from specgen.models.cache.hybrid import HybridCache
from specgen.models.family import MultimodalText, register
from specgen.models.family_config import attention_args, config_errors, token_ids
from specgen.models.layers.decoder import DecoderLayer
from specgen.models.layers.gated_deltanet import GatedDeltaNetLayer


@dataclass(frozen=True)
class HybridArgs:
    """Qwen3.5's Gated DeltaNet layers: which layers they are, and their shapes."""

    layer_types: tuple[str, ...]  # per layer: LINEAR (Gated DeltaNet) or FULL (attention)
    conv_kernel: int  # the depthwise causal conv over q/k/v
    key_heads: int
    value_heads: int  # a multiple of key_heads: each q/k head serves several value heads
    key_dim: int
    value_dim: int

    @property
    def conv_dim(self) -> int:  # channels of the conv: q, k and v side by side
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim

    def linear(self, layer: int) -> bool:
        return self.layer_types[layer] == LINEAR


class Qwen3_5(MultimodalText):
    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_text")
    warm_start_refusal = (
        "--init target copies the target's attention layers into the drafter, but this "
        "target's are Gated DeltaNet and gated-attention layers (Qwen3.5); use --init random"
    )

    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs:
        """From `text_config` of the multimodal checkpoint, or a text-only config."""
        text = cfg.get("text_config") or cfg
        if not isinstance(text, dict):
            raise CheckpointError(f"{name}: config.json has a malformed text_config")
        if text.get("num_experts"):
            raise moe_refusal(name, "Qwen3.5")
        with config_errors(name):
            layers = int(text["num_hidden_layers"])
            hybrid = _hybrid(text, layers, name)
            params = text.get("rope_parameters") or {}
            partial = float(
                params.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
            )
            base = {**text, "rope_parameters": params}
            base.setdefault("head_dim", 256)
            base.setdefault("rope_theta", params.get("rope_theta", 10000.0))
            # the multimodal wrapper decides tying at the top, a text-only config its own
            base["tie_word_embeddings"] = cfg.get(
                "tie_word_embeddings", text.get("tie_word_embeddings", False)
            )
            args = attention_args(base, name, family=self.name, qk_norm=True)
        rotary = int(args.head_dim * partial)
        if rotary % 2 or not 0 < rotary <= args.head_dim:
            raise CheckpointError(
                f"{name}: partial_rotary_factor {partial} gives no usable rotary size"
            )
        return replace(
            args,
            layout=hybrid,
            attn_output_gate=bool(text.get("attn_output_gate", True)),
            rotary_dim=rotary,
            norm_offset=True,
            fp32_norms=True,
            eos_token_ids=args.eos_token_ids or token_ids(cfg.get("eos_token_id")),
        )

    def layer(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        if args.layout.linear(index):
            return GatedDeltaNetLayer(args, dtype, device)
        return DecoderLayer(args, dtype, device)  # gated attention: q_proj carries the gate

    def new_cache(self, args, *, batch, capacity, steps, dtype, device) -> HybridCache:
        return HybridCache(
            args, batch=batch, capacity=capacity, steps=steps, dtype=dtype, device=device
        )

    def finish_load(self, model: nn.Module) -> None:
        """Zero-centred norms: scale = 1 + w, added once (fp32 parameters, so exact); each
        Gated DeltaNet layer's decay -exp(A_log), computed once as every step computed it.
        llama.cpp's converter stores both so: a GGUF target skips this (gguf_index.py)."""
        weights = [model.norm]
        for layer in model.layers:
            weights += [layer.attn_norm, layer.ffn_norm]
            if isinstance(layer, DecoderLayer):
                weights += [layer.q_norm, layer.k_norm]
            else:
                layer.decay.data.exp_().neg_()
        for w in weights:
            w.data.add_(1.0)

    def kv_bytes(self, args: ModelArgs, context: int, element_size: int) -> int:
        attention = args.num_layers - args.layout.layer_types.count(LINEAR)
        return 2 * attention * args.num_kv_heads * args.head_dim * element_size * context

    def state_bytes(self, args: ModelArgs) -> int:
        hy = args.layout  # fp32 recurrent states: read, and written back once
        return 2 * hy.layer_types.count(LINEAR) * hy.value_heads * hy.key_dim * hy.value_dim * 4


def moe_refusal(name: str, family: str) -> CheckpointError:
    return CheckpointError(
        f"{name}: {family} mixture-of-experts targets are not supported (specgen "
        "has no expert layers); the dense models run (e.g. qwen3.5-4b, -9b, -27b)"
    )


def _hybrid(text: dict[str, Any], layers: int, name: str) -> HybridArgs:
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
    return hybrid


def _default_layer_types(text: dict[str, Any], layers: int) -> list[str]:
    """transformers' default: every `full_attention_interval`-th layer is full attention."""
    interval = int(text.get("full_attention_interval", 4))
    return [FULL if (i + 1) % interval == 0 else LINEAR for i in range(layers)]


QWEN3_5 = register(Qwen3_5())
