"""Llama-shaped targets: Llama 3.x, SmolLM2, Qwen2, Qwen3, Mistral (one decoder layer, flags
apart).

A newcomer of this shape is one more `VARIANTS` entry: its config's `model_type`, which
projections carry biases, whether q/k get a per-head norm, and how its config switches a
sliding window on (specgen refuses windowed targets of this shape rather than ignore it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specgen.core.config import ModelArgs
from specgen.core.errors import CheckpointError
from specgen.models.family import Family, register
from specgen.models.family_config import attention_args
from specgen.models.layers.decoder import DecoderLayer


@dataclass(frozen=True)
class Variant:
    qkv_bias: bool | None = None  # None: the config's `attention_bias`
    o_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE
    window_when_set: bool = False  # `sliding_window` applies whenever set (no on/off flag)


VARIANTS = {  # model_type -> what sets it apart
    "llama": Variant(),
    "qwen2": Variant(qkv_bias=True, o_bias=False),  # Qwen2 always biases q/k/v, never o
    "qwen3": Variant(qk_norm=True),
    "mistral": Variant(window_when_set=True),  # v0.1's 4096 window; v0.2 on: none
}


class LlamaShaped(Family):
    name = "llama"
    model_types = tuple(VARIANTS)
    names = tuple(VARIANTS)
    fused_cpu = True  # decoder.c is this layer (biases and q/k norms included)

    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs:
        model_type = str(cfg.get("model_type"))
        v = VARIANTS[model_type]
        if v.window_when_set and cfg.get("sliding_window"):
            raise CheckpointError(f"{name}: sliding-window attention targets are not supported")
        return attention_args(
            cfg, name, family=model_type, qkv_bias=v.qkv_bias, o_bias=v.o_bias, qk_norm=v.qk_norm
        )

    def layer(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        return DecoderLayer(args, dtype, device)


LLAMA = register(LlamaShaped())
