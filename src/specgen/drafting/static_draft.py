"""A block drafter's draft step with fixed shapes, for one CUDA graph per drafter.

DFlash and DSpark draft the same way up to their heads: [anchor, MASK x (B-1)] is embedded
and run through the backbone after the context, every query seeing the whole context and
the whole block. Here the context length and the anchor are read from device memory, so
the step (backbone, then the drafter's own `finish`: head and argmax, or DSpark's Markov
draw) is captured once and replayed at any length (engine/cuda_graphs.py). It drafts the
full block; a shorter draft is a prefix of it, since every head drafts left to right.
With `capture` False it runs the same code eagerly: the CPU tests. Greedy only; a sampled
draft draws from a host generator and runs eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specgen.drafting.base import Draft
from specgen.drafting.context import DraftContext
from specgen.engine.cuda_graphs import Replay

if TYPE_CHECKING:
    from specgen.models.dflash import DFlashNet
    from specgen.models.transformer import Transformer


class StaticBlockDraft:
    def __init__(
        self,
        context: DraftContext,
        backbone: DFlashNet,  # full-attention layers only (`static_ready`)
        target: Transformer,
        masks: list[int],
        finish: Callable[[torch.Tensor, torch.Tensor], Draft],  # (hidden [1,B,H], anchor [1])
        capture: bool,
    ) -> None:
        cache = context.cache
        self.ids = torch.tensor([[0, *masks]], device=target.device)
        self.start = torch.zeros(1, dtype=torch.long, device=target.device)
        # the masked attention weighs dead positions by 0: they must hold finite values
        cache.k[:, :, :, cache.length :].zero_()
        cache.v[:, :, :, cache.length :].zero_()

        def draft() -> Draft:
            block = target.embed_tokens(self.ids)
            hidden = backbone.block_hidden_static(cache, block, self.start)
            return finish(hidden, self.ids[0, :1])

        self._draft = draft
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self._replay: Replay | None = None  # captured at the first draft

    def __call__(self, anchor: int, start: int, k: int) -> Draft:
        """The first k tokens (and confidences) of the block's draft after `start` context
        tokens: a prefix of the full draft, since every head drafts left to right. Copied
        out, as the next replay overwrites the graph's outputs."""
        self.ids[:, :1].fill_(anchor)
        self.start.fill_(start)
        if self._replay is None:
            self._replay = Replay(self._draft, self._pool)
        full = self._replay()
        confidence = None if full.confidence is None else full.confidence[:, :k].clone()
        return Draft(tokens=full.tokens[:, :k].clone(), confidence=confidence)
