"""`--method dflash2`: z-lab's DFlash 2 drafter (DFlash's block pass, convolutions in every
layer, and a candidate selector that drafts a chain; methods/dflash2/network.py).

Each step runs the block once, as DFlash, then walks the draft slots left to right through
the selector: top-`selector_top_k` candidates of each slot's logits, scored against the
token chosen before (the anchor first). Greedy takes the best-scoring candidate; sampling
draws from softmax(score / T) over the candidates (temperature only, as z-lab's
`dflash_generate`) and hands the verifier that q scattered into the vocabulary (zero
elsewhere), so the shared rejection sampler stays exact. A sampled walk is an exponential
race over noise drawn up front, so it has fixed device ops and replays as a CUDA graph.

Its own method name (not `--method dflash`): its drafts are a chain, sampled drafts carry
a q unlike DFlash's point mass, and its acceptance differs, so its stats, measured costs
and the scheduler's history are kept apart; `stacked` may mount it beside DFlash.
`--method dflash` given a DFlash 2 checkpoint runs it as dflash2 (`variants`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.drafting.base import Checkpoint, register
from specgen.drafting.block import BlockDrafter, BlockMethod
from specgen.drafting.static_draft import StaticBlockDraft
from specgen.methods.dflash2.export import EXPORT
from specgen.methods.dflash2.network import ARCHITECTURE, DFlash2Net, load_dflash2
from specgen.models.graphs import GREEDY

if TYPE_CHECKING:
    from specgen.models.transformer import Transformer


@register("dflash2")
class DFlash2Method(BlockMethod):
    architectures = (ARCHITECTURE,)
    export = EXPORT
    label = "DFlash 2"

    @classmethod
    def load_net(cls, checkpoint: Checkpoint, target: Transformer, target_name: str) -> DFlash2Net:
        return load_dflash2(
            checkpoint.path, target=target, target_name=target_name, name=checkpoint.name
        )

    @classmethod
    def trained_block(cls, net: DFlash2Net) -> int:
        return net.args.block_size

    def draft_slots(self, block_size: int) -> int:
        return block_size - 1  # slot 0 holds the anchor, as DFlash's

    def new_drafter(self, capacity: int) -> DFlash2Drafter:
        return DFlash2Drafter(self, capacity)


class DFlash2Drafter(BlockDrafter):
    options = (DraftOption(),)  # one kind of draft, its length settled before drafting

    def __init__(self, method: DFlash2Method, capacity: int) -> None:
        # each sampled step's races, by temperature: allocated once, refilled before each
        # draft (a graph reads them where they are)
        self._races: dict[float, torch.Tensor] = {}
        super().__init__(method, capacity, method.net)
        self.vocab = method.vocab

    def build_step(self, key: object, capture: bool) -> StaticBlockDraft:
        """A draft step with fixed shapes: block, head, chain walk; greedy, or sampled at
        the temperature `key` (its races in `_races[key]`)."""
        if key == GREEDY:
            return self._step(None, None, capture)
        return self._step(key, self._races[key], capture)  # type: ignore[arg-type,index]

    def _step(
        self, temperature: float | None, noise: torch.Tensor | None, capture: bool
    ) -> StaticBlockDraft:
        def finish(hidden: torch.Tensor, anchor: torch.Tensor) -> Draft:
            slots = hidden[:, 1 : 1 + self.max_draft_tokens]
            return self._walk(slots, anchor, temperature, noise)

        return self._static_step(finish, capture)

    def _walk(
        self,
        hidden: torch.Tensor,  # [1, k, H]: the draft slots' outputs
        anchor: torch.Tensor,  # [1] int64 on the device
        temperature: float | None,  # None: greedy
        noise: torch.Tensor | None,  # [max drafts, top_k] Exp(1) for a sampled walk
    ) -> Draft:
        net, vocab, h = self.net, self.vocab, hidden[0]
        if vocab is None:
            logits, ids = net.head(self.target, h), None
        else:
            logits, ids = net.logits(vocab.logits(h)), vocab.ids
        tokens, candidates, q = net.selector.walk(h, logits, ids, anchor, temperature, noise)
        probs = None
        if q is not None:  # q over the candidates, as a distribution over the vocabulary
            full = q.new_zeros(q.shape[0], net.args.layers.vocab_size)
            probs = full.scatter_(1, candidates, q)[None]
        return Draft(tokens=tokens[None], probs=probs)

    def _race_buffer(self) -> torch.Tensor:  # [max drafts, top_k], unfilled
        width = self.net.selector.top_k
        return torch.empty(self.max_draft_tokens, width, device=self.target.device)

    def _sampled(
        self,
        anchor: int | torch.Tensor,
        start: int | torch.Tensor,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """A sampled draft from the fixed-shape step of this temperature, its races drawn
        into the step's input buffer first (a CUDA graph with graphs on, else eager)."""
        key = params.temperature
        if key not in self._races:
            self._races[key] = self._race_buffer()
        self._races[key].exponential_(generator=generator)
        return self.steps(key, anchor, start, k)

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
        greedy = params is None or params.greedy or generator is None
        if greedy:
            draft = self._graphed(anchor, cache.length, k)
            if draft is not None:
                return draft
        elif self.steps.on:  # graphs on: the sampled step is one too
            return self._sampled(anchor, cache.length, k, params, generator)
        hidden = self.net.block_hidden(cache, self._block(anchor))[:, 1 : k + 1]
        start = torch.tensor([anchor], device=self.target.device)
        if greedy:
            return self._walk(hidden, start, None, None)
        noise = self._race_buffer().exponential_(generator=generator)  # every slot's races
        return self._walk(hidden, start, params.temperature, noise)

    @torch.inference_mode()
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the context length
        k: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """`propose` for the device-resident loop."""
        if params is None or params.greedy or generator is None:
            return self._fixed(anchor, start, k)
        return self._sampled(anchor, start, k, params, generator)
