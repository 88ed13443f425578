"""The family registry: what a target family tells the rest of specgen.

A family (models/families/) reads its Hub config into `ModelArgs`, builds its layers and
its cache, says where its checkpoint keeps the text backbone, and what a decoding step
reads besides the weights (for the roofline). `Transformer`, the loader, the roofline and
training never name a family: they ask `family_of(args)`. A Llama-shaped newcomer is a
registry entry in families/llama.py; a structurally new family is one module here plus
its layers (docs/design.md, "Adding a target family").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from torch import nn

from specgen.core.config import ModelArgs, RopeArgs
from specgen.core.errors import CheckpointError
from specgen.models.cache.kv import StaticKVCache
from specgen.models.plans import text_prefix


class Family(ABC):
    """Defaults fit a plain attention-only decoder; families override what differs (and
    must say how they parse and which layer each index is)."""

    name = ""
    model_types: tuple[str, ...] = ()  # config.json `model_type`s this family reads
    names: tuple[str, ...] = ()  # `ModelArgs.family` values it builds (default: name)
    # why `specgen train --init target` cannot copy this family's layers (None: it can)
    warm_start_refusal: str | None = None
    # whether the fused CPU pass (kernels/cpu/decoder.c) computes this family's layer: off
    # unless a family says so; the pass then checks each of the model's options against
    # what it implements (models/fused/cpu_pass.py, `OPTIONS`)
    fused_cpu: bool = False

    @abstractmethod
    def parse(self, cfg: dict[str, Any], name: str) -> ModelArgs: ...

    @abstractmethod
    def layer(
        self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device
    ) -> nn.Module: ...

    def rope(self, args: ModelArgs, index: int) -> tuple[RopeArgs, int]:
        """Layer `index`'s RoPE and its rotary width (layers of one kind share a table)."""
        return args.rope, args.rope_dim

    def window(self, args: ModelArgs, index: int) -> int | None:
        """Layer `index`'s sliding window (None: it sees every earlier key)."""
        return None

    def new_cache(
        self, args: ModelArgs, *, batch: int, capacity: int, steps: int, dtype: torch.dtype,
        device: torch.device,
    ) -> StaticKVCache:  # fmt: skip
        return StaticKVCache(
            num_layers=args.num_layers, batch=batch, num_kv_heads=args.num_kv_heads,
            head_dim=args.head_dim, capacity=capacity, dtype=dtype, device=device,
        )  # fmt: skip

    def prefix(self, keys) -> str:
        """Where the checkpoint keeps the decoder's tensors."""
        return "model."

    def head_key(self, prefix: str) -> str:
        """Where the checkpoint keeps an untied LM head (its backbone under `prefix`)."""
        return "lm_head.weight"

    def drafter_config(self, flat: dict[str, Any]) -> dict[str, Any]:
        """The target's flat text config as a drafter of plain attention layers starts
        from it (`specgen train`): without the fields of layers a drafter does not have."""
        return flat

    def finish_load(self, model: nn.Module) -> None:
        """What to do once every tensor is in place (nothing, unless overridden)."""
        return None

    def kv_bytes(self, args: ModelArgs, context: int, element_size: int) -> int:
        """Bytes of K and V a decoding step reads at `context` cached tokens."""
        per_token = 2 * args.num_layers * args.num_kv_heads * args.head_dim * element_size
        return per_token * context

    def state_bytes(self, args: ModelArgs) -> int:
        """Bytes of recurrent state a decoding step reads and writes back (none here)."""
        return 0


class MultimodalText(Family):
    """A family published as multimodal checkpoints, text under `model.language_model.`."""

    def prefix(self, keys) -> str:
        return text_prefix(keys)


_BY_NAME: dict[str, Family] = {}
_BY_TYPE: dict[str, Family] = {}


def register(family: Family) -> Family:
    for name in family.names or (family.name,):
        _BY_NAME[name] = family
    for model_type in family.model_types:
        _BY_TYPE[model_type] = family
    return family


def family_of(args: ModelArgs) -> Family:
    return _BY_NAME[args.family]


def family_for_config(cfg: dict[str, Any]) -> Family | None:
    """The family a config.json's `model_type` names, if specgen has it."""
    return _BY_TYPE.get(str(cfg.get("model_type")))


def family_for_type(model_type: Any, cfg: dict[str, Any], name: str) -> Family:
    family = _BY_TYPE.get(str(model_type))
    if family is None:
        arch = ", ".join(cfg.get("architectures") or []) or "unknown architecture"
        known = ", ".join(sorted(_BY_TYPE))
        raise CheckpointError(
            f"{name}: unsupported architecture {model_type!r} ({arch}); "
            f"specgen runs the {known} families"
        )
    return family
