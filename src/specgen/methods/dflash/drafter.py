"""`--method dflash`: z-lab's block-diffusion drafter (one parallel pass per block).

Each step embeds [anchor, MASK x (B-1)], runs the drafter once over it with the target's
context features injected as K/V, and takes the argmax of the target's LM head at slots
1..B-1: B-1 draft tokens from one small forward. Context K/V are appended as the target
commits tokens (never recomputed) and rolled back with the target's cache.

Sampling (temperature > 0) still drafts greedily: the draft is a point mass, and the
shared verifier accepts d with probability p(d) and otherwise samples from p with d
removed. That is exact rejection sampling for a point-mass proposal, so the output has
the target's distribution; drafting at temperature would only change the acceptance rate.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.drafting.base import Checkpoint, register
from specgen.drafting.block import BlockDrafter, BlockMethod
from specgen.drafting.static_draft import StaticBlockDraft
from specgen.methods.dflash.export import EXPORT
from specgen.models.drafters.dflash import DFlashNet, load_dflash
from specgen.training.block_drafters import BlockTraining

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams
    from specgen.models.transformer import Transformer


@register("dflash")
class DFlashMethod(BlockMethod):
    architectures = ("DFlashDraftModel",)
    training = BlockTraining()  # the block drafters' training is DFlash's as it stands
    export = EXPORT
    # a DFlash 2 checkpoint given to --method dflash (methods/dflash2/drafter.py)
    variants = ("dflash2",)
    label = "DFlash"

    @classmethod
    def load_net(cls, checkpoint: Checkpoint, target: Transformer, target_name: str) -> DFlashNet:
        return load_dflash(
            checkpoint.path, target=target, target_name=target_name, name=checkpoint.name
        )

    @classmethod
    def trained_block(cls, net: DFlashNet) -> int:
        return net.args.block_size

    def draft_slots(self, block_size: int) -> int:
        return block_size - 1  # slot 0 holds the anchor

    def new_drafter(self, capacity: int) -> DFlashDrafter:
        return DFlashDrafter(self, capacity)


class DFlashDrafter(BlockDrafter):
    options = (DraftOption(),)  # one kind of draft: the scheduler may skip it when it won't pay

    def __init__(self, method: DFlashMethod, capacity: int) -> None:
        super().__init__(method, capacity, method.net)
        self.vocab = method.vocab

    def build_step(self, key: object, capture: bool) -> StaticBlockDraft:
        """The draft step with fixed shapes (see drafting/static_draft.py); greedy only."""

        def finish(hidden: torch.Tensor, anchor: torch.Tensor) -> Draft:
            return self._draft(hidden[:, 1:])

        return self._static_step(finish, capture)

    def _draft(self, hidden: torch.Tensor) -> Draft:
        """Greedy tokens from the block's hidden states (slot j predicts anchor + j)."""
        vocab, net = self.vocab, self.net
        if vocab is None:
            return Draft(tokens=net.head(self.target, hidden).argmax(dim=-1))
        return Draft(tokens=vocab.ids[net.logits(vocab.logits(hidden)).argmax(dim=-1)])

    @torch.inference_mode()
    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        k = min(max_tokens, self.max_draft_tokens)
        if k <= 0:
            return empty_draft(self.target.device)
        cache = self.context.ready()
        draft = self._graphed(anchor, cache.length, k)
        if draft is not None:
            return draft
        return self._draft(self.net.block_hidden(cache, self._block(anchor))[:, 1 : k + 1])

    @torch.inference_mode()
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the context length
        k: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """`propose` for the device-resident loop (always greedy, as `propose`)."""
        return self._fixed(anchor, start, k)
