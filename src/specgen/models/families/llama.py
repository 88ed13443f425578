"""Llama-shaped targets: Llama 3.x, SmolLM2, Qwen2, Qwen3 (one decoder layer, flags apart).

A newcomer of this shape (e.g. Mistral) is one more `VARIANTS` entry: its config's
`model_type`, and which projections carry biases and whether q/k get a per-head norm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specgen.config import ModelArgs
from specgen.models.decoder_layer import DecoderLayer
from specgen.models.families.common import attention_args
from specgen.models.family import Family, register


@dataclass(frozen=True)
class Variant:
    qkv_bias: bool | None = None  # None: the config's `attention_bias`
    o_bias: bool | None = None
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE


VARIANTS = {  # model_type -> what sets it apart
    "llama": Variant(),
    "qwen2": Variant(qkv_bias=True, o_bias=False),  # Qwen2 always biases q/k/v, never o
    "qwen3": Variant(qk_norm=True),
}


class LlamaShaped(Family):
    name = "llama"
    model_types = tuple(VARIANTS)
    names = tuple(VARIANTS)

    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs:
        model_type = str(cfg.get("model_type"))
        v = VARIANTS[model_type]
        return attention_args(
            cfg, name, family=model_type, qkv_bias=v.qkv_bias, o_bias=v.o_bias, qk_norm=v.qk_norm
        )

    def layer(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        return DecoderLayer(args, dtype, device)


LLAMA = register(LlamaShaped())
