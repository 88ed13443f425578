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

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specgen.drafting.base import Draft, DraftOption, empty_draft, register
from specgen.drafting.static_draft import BlockDrafter, StaticBlockDraft
from specgen.drafting.vocab import DraftVocab, load_draft_vocab
from specgen.errors import SpecgenError
from specgen.hub import resolve_drafter
from specgen.models.dflash import DFlashNet, load_dflash

if TYPE_CHECKING:
    from specgen.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


@register("dflash")
class DFlashMethod:
    architectures: tuple[str, ...] = ("DFlashDraftModel",)
    needs_drafter = True
    drafters_needed = 1

    def __init__(
        self,
        net: DFlashNet,
        target: Transformer,
        block_size: int,
        draft_tokens: int | None,
        vocab: DraftVocab | None = None,
    ) -> None:
        self.net = net
        self.target = target
        self.vocab = vocab  # drafts come from these head rows only (drafting/vocab.py)
        self.block_size = block_size
        self.max_draft_tokens = min(block_size - 1, draft_tokens or block_size)
        self.cuda_graphs = False  # draft steps as CUDA graphs (set by `load` on CUDA)

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> DFlashMethod:
        source = spec.drafter
        if source is None:  # Pipeline.load fills in the registry's; direct use must say
            raise SpecgenError(f"no dflash drafter given for {target_name}; pass --drafter")
        if notify:
            notify(f"loading DFlash drafter {source}")
        path = resolve_drafter(source)
        net = load_dflash(path, target=target, target_name=target_name, name=source)
        block = spec.block_size or net.args.block_size
        if block > net.args.block_size:
            raise SpecgenError(
                f"--block-size {block} exceeds the block {net.args.block_size} {source} was "
                "trained with (smaller blocks work, larger ones do not)"
            )
        vocab = load_draft_vocab(path, target.lm_head, source)
        method = cls(net, target, block, spec.draft_tokens, vocab)
        method.cuda_graphs = spec.cuda_graphs and target.device.type == "cuda"
        return method

    def new_drafter(self, capacity: int) -> DFlashDrafter:
        return DFlashDrafter(self, capacity)


class DFlashDrafter(BlockDrafter):
    options = (DraftOption(),)  # one kind of draft: the scheduler may skip it when it won't pay

    def __init__(self, method: DFlashMethod, capacity: int) -> None:
        self.net, self.target = method.net, method.target
        self.backbone = method.net
        self.vocab = method.vocab
        self.block_size = method.block_size
        self.max_draft_tokens = method.max_draft_tokens
        self.taps = method.net.args.target_layer_ids
        self.context = self.new_context(capacity)
        self._masks = [method.net.args.mask_token_id] * (self.block_size - 1)
        self.static: StaticBlockDraft | None = None  # the draft step as a CUDA graph
        if method.cuda_graphs:
            self.static = self.static_draft(capture=True)

    def static_draft(self, *, capture: bool) -> StaticBlockDraft:
        """The draft step with fixed shapes (see drafting/static_draft.py)."""

        def finish(hidden: torch.Tensor, anchor: torch.Tensor) -> Draft:
            return self._draft(hidden[:, 1:])

        return StaticBlockDraft(self.context, self.net, self.target, self._masks, finish, capture)

    def _draft(self, hidden: torch.Tensor) -> Draft:
        """Greedy tokens from the block's hidden states (slot j predicts anchor + j)."""
        vocab = self.vocab
        if vocab is None:
            return Draft(tokens=self.target.head(hidden).argmax(dim=-1))
        return Draft(tokens=vocab.ids[vocab.logits(hidden).argmax(dim=-1)])

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
        ids = torch.tensor([[anchor, *self._masks]], device=self.target.device)
        block = self.target.embed_tokens(ids)
        return self._draft(self.net.block_hidden(cache, block)[:, 1 : k + 1])

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
