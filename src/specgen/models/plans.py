"""One load-plan row: which checkpoint tensor fills which weight, at which rows, with which
shape. Every layer yields its own rows (`plan(prefix)`), models add theirs around them,
and models/loading.fill copies a plan into place.

Fused matrices (q/k/v, gate/up, Gated DeltaNet's input projections) take several
checkpoint tensors, each at its row offset. Optional rows (a Gemma layer's `layer_scalar`,
DSpark's confidence bias) keep their initial value when the checkpoint lacks them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from specgen.models.formats.packed_matrix import PackedMatrix
from specgen.models.formats.weights import LinearWeight

MULTIMODAL_PREFIX = "model.language_model."


@dataclass(frozen=True)
class Row:
    key: str  # the checkpoint's tensor name
    dest: LinearWeight | torch.Tensor  # where it goes
    shape: tuple[int, ...]  # the shape it must have under this config
    offset: int = 0  # first destination row (a part of a fused matrix)
    optional: bool = False  # absent: the destination keeps its initial value

    def read(self) -> torch.Tensor:
        """The destination's rows as the checkpoint tensor (what a checkpoint writer saves)."""
        whole = self.dest.dense() if isinstance(self.dest, LinearWeight) else self.dest
        return whole[self.offset : self.offset + self.shape[0]]

    def load(self, tensor) -> None:  # a tensor, or a PackedMatrix from a quantized file
        if isinstance(self.dest, LinearWeight):
            self.dest.load(tensor, self.offset)
        else:
            if isinstance(tensor, PackedMatrix):  # a norm or bias stored quantized
                tensor = tensor.dequantize(dtype=self.dest.dtype)
            self.dest.data[self.offset : self.offset + tensor.shape[0]].copy_(tensor)


Plan = Iterable[Row]


def text_prefix(keys) -> str:
    """Where a text backbone's tensors live: under `model.language_model.` in the
    multimodal checkpoints Qwen3.5 and Gemma 4 are published as, else under `model.`."""
    return MULTIMODAL_PREFIX if MULTIMODAL_PREFIX + "embed_tokens.weight" in keys else "model."
