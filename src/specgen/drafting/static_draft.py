"""A block drafter's draft step with fixed shapes, for one CUDA graph per drafter.

DFlash and DSpark draft the same way up to their heads: [anchor, MASK x (B-1)] is embedded
and run through the backbone after the context, every query seeing the whole context and
the whole block. Here the context length and the anchor are read from device memory, so
the step (backbone, then the drafter's own `finish`: head and argmax, or DSpark's Markov
draw) is captured once and replayed at any length (models/graphs.py). It drafts the
full block; a shorter draft is a prefix of it, since every head drafts left to right.
With `capture` False it runs the same code eagerly: the CPU tests, and the device-resident
loop (engine/resident.py) where graphs are off. A sampled draft (DSpark) reads its random
numbers from a buffer the drafter fills before each call, so it has fixed shapes too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft
from specgen.drafting.context import DraftContext
from specgen.models.graphs import Replay, set_input

if TYPE_CHECKING:
    from specgen.models.drafters.dflash import DFlashNet
    from specgen.models.transformer import Transformer


class StaticBlockDraft:
    def __init__(
        self,
        context: DraftContext,
        backbone: DFlashNet,
        target: Transformer,
        masks: list[int],
        finish: Callable[[torch.Tensor, torch.Tensor], Draft],  # (hidden [1,B,H], anchor [1])
        capture: bool,
    ) -> None:
        self._cache, self._backbone, self._target = context.cache, backbone, target
        self.ids = torch.tensor([[0, *masks]], device=target.device)
        self.start = torch.zeros(1, dtype=torch.long, device=target.device)
        self._cache.make_finite()  # the masked attention reads dead positions (weighted by 0)
        self._draft = lambda: finish(self._block_hidden(), self.ids[0, :1])
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._replay: Replay | None = None  # captured at the first draft

    def __call__(self, anchor: int | torch.Tensor, start: int | torch.Tensor, k: int) -> Draft:
        """The first k tokens (and confidences) of the block's draft after `start` context
        tokens: a prefix of the full draft, since every head drafts left to right. Copied
        out, as the next replay overwrites the graph's outputs. `anchor` and `start` are
        host ints, or device tensors ([1, 1] and [1] int64) that the host never reads."""
        self._place(anchor, start)
        if self._replay is None:
            self._replay = Replay(self._draft, self._pool)
        full = self._replay()
        return Draft(
            tokens=full.tokens[:, :k].clone(),
            probs=None if full.probs is None else full.probs[:, :k].clone(),
            confidence=None if full.confidence is None else full.confidence[:, :k].clone(),
        )

    def _block_hidden(self) -> torch.Tensor:
        block = self._backbone.embed_block(self._target, self.ids)
        return self._backbone.block_hidden_static(self._cache, block, self.start)

    def _place(self, anchor: int | torch.Tensor, start: int | torch.Tensor) -> None:
        set_input(self.ids[:, :1], anchor)
        set_input(self.start, start)
