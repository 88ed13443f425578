"""A block drafter's draft step with fixed shapes, for one CUDA graph per drafter.

DFlash and DSpark draft the same way up to their heads: [anchor, MASK x (B-1)] is embedded
and run through the backbone after the context, every query seeing the whole context and
the whole block. Here the context length and the anchor are read from device memory, so
the step (backbone, then the drafter's own `finish`: head and argmax, or DSpark's Markov
draw) is captured once and replayed at any length (engine/cuda_graphs.py). It drafts the
full block; a shorter draft is a prefix of it, since every head drafts left to right.
With `capture` False it runs the same code eagerly: the CPU tests, and the device-resident
loop (engine/resident.py) where graphs are off. A sampled draft (DSpark) reads its random
numbers from a buffer the drafter fills before each call, so it has fixed shapes too.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from specgen.drafting.base import Draft
from specgen.drafting.context import DraftContext
from specgen.engine.cuda_graphs import Replay, graphs_failed, set_input

if TYPE_CHECKING:
    from specgen.models.dflash import DFlashNet
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
        block = self._target.embed_tokens(self.ids)
        return self._backbone.block_hidden_static(self._cache, block, self.start)

    def _place(self, anchor: int | torch.Tensor, start: int | torch.Tensor) -> None:
        set_input(self.ids[:, :1], anchor)
        set_input(self.start, start)


class BlockDrafter(ABC):
    """What DFlash's and DSpark's drafters share: a context of the target's features that
    follows the target cache, and a fixed-shape draft step (`StaticBlockDraft`) that the
    device-resident loop drives with the anchor and the context length on the device."""

    taps: tuple[int, ...]
    context: DraftContext
    backbone: DFlashNet
    static: StaticBlockDraft | None  # the draft step as a CUDA graph
    _eager: StaticBlockDraft | None = None  # the same step, run eagerly

    @abstractmethod
    def static_draft(self, *, capture: bool) -> StaticBlockDraft:
        """The drafter's fixed-shape draft step (its head on `StaticBlockDraft`)."""

    def new_context(self, capacity: int) -> DraftContext:
        net = self.backbone
        return DraftContext(net.new_cache(capacity), net.extend, net.extend_at)

    def rollback(self, length: int) -> None:
        self.context.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        self.context.append(self._features(taps))

    # The device-resident loop (engine/resident.py): `begin_resident`, then per step
    # `draft_at` and `observe_at` with device positions, and `assume` when the host learns
    # the committed length.

    resident = True  # its draft step has fixed shapes (engine/resident.py can drive it)

    def begin_resident(self) -> None:
        self.context.ready()  # what waits is projected now; `observe_at` writes the rest

    def observe_at(self, taps: Mapping[int, torch.Tensor], start: torch.Tensor) -> None:
        """Every verified position's features, written from `start` ([1] on the device)."""
        self.context.write_at(self._features(taps), start)

    def assume(self, length: int, committed: int | None = None) -> None:
        """The first `length` context positions are the committed ones (`committed`: what
        the step just learnt committed, which only a drafter with a selector needs)."""
        self.context.assume(length)

    def _features(self, taps: Mapping[int, torch.Tensor]) -> torch.Tensor:  # [1, T, K*H]
        return torch.cat([taps[i] for i in self.taps], dim=-1)

    def _graphed(
        self, anchor: int | torch.Tensor, start: int | torch.Tensor, k: int
    ) -> Draft | None:
        """The greedy draft as a graph replay; None without a graph (or when its capture
        just failed: the session then drafts eagerly, with the same output)."""
        if self.static is not None:
            try:
                return self.static(anchor, start, k)
            except RuntimeError as e:  # a capture this setup cannot do
                self.static = None
                graphs_failed(e)
        return None

    def _fixed(self, anchor: torch.Tensor, start: torch.Tensor, k: int) -> Draft:
        """The fixed-shape greedy draft from device state: replayed, or run eagerly."""
        draft = self._graphed(anchor, start, k)
        return self._eager_step()(anchor, start, k) if draft is None else draft

    def _eager_step(self) -> StaticBlockDraft:
        if self._eager is None:
            self._eager = self.static_draft(capture=False)
        return self._eager
