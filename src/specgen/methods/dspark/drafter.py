"""`--method dspark`: DeepSpec's DSpark drafter (block backbone + Markov head + confidence).

Each step runs the backbone once over [anchor, MASK x (g-1)] (context K/V cached and
rolled back with the target, as for DFlash), takes the LM-head logits of the draft slots,
then walks the slots left to right: add the Markov bias of the previous token, draw the
token (argmax at temperature 0; otherwise a sample from the corrected distribution after
the request's temperature / top-k / top-p, whose probabilities go to the verifier so
rejection sampling stays exact; an exponential race over noise drawn up front, so the
sampled draft step has fixed device ops and replays as a CUDA graph too), and read the
confidence head before the draw. The confidences (per-position temperature-calibrated when
`specgen calibrate` has fitted the drafter) feed the verify-length scheduler.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.core.errors import SpecgenError
from specgen.drafting.base import Checkpoint, register
from specgen.drafting.block import BlockDrafter, BlockMethod
from specgen.drafting.static_draft import StaticBlockDraft
from specgen.drafting.vocab import DraftVocab
from specgen.kernels import backend
from specgen.methods.dspark.calibration import Calibration, load_calibration
from specgen.methods.dspark.export import EXPORT
from specgen.methods.dspark.network import DSparkNet, load_dspark
from specgen.methods.dspark.training import DSparkTraining
from specgen.models.graphs import GREEDY
from specgen.verify.sampling import probabilities

if TYPE_CHECKING:
    from specgen.models.transformer import Transformer


@torch.inference_mode()
def markov_draw(
    net: DSparkNet,
    base: torch.Tensor,  # [k, V]: backbone logits of the k draft slots
    hidden: torch.Tensor,  # [k, H]: the slots' backbone outputs (after the final norm)
    anchor: int | torch.Tensor,  # the id, or [1] int64 on the device (a CUDA graph's input)
    params: SamplingParams,
    generator: torch.Generator | None,
    calibration: Calibration | None = None,
    vocab: DraftVocab | None = None,
    noise: torch.Tensor | None = None,
) -> Draft:
    """Draw k draft tokens left to right through the Markov head. With `vocab`, `base`
    covers only its tokens ([k, V']) and so does every draw.

    A sampled draw is an exponential race: token j is argmax(q_j / E_j) with E_j ~ Exp(1)
    per token, which picks i with probability q_j(i). The races' `noise` ([>= k, V'],
    Exp(1)) is drawn up front, from `generator` when not given: with it as an input the
    whole draw is a fixed sequence of device ops, which a CUDA graph can replay. On CUDA a
    vanilla head draws in one Triton launch (kernels/markov.py), greedy or sampled at a
    temperature alone; top-k / top-p sampling runs the torch loop."""
    greedy = params.greedy or (generator is None and noise is None)
    k = base.shape[0]
    if not greedy and noise is None:
        noise = race_noise(k, base.shape[1], generator, base.device)
    if _fused(net, base) and (greedy or _temperature_only(params, base.shape[1])):
        return _fused_draw(net, base, hidden, anchor, calibration, vocab, params, noise)
    prev = anchor
    if not isinstance(prev, torch.Tensor):
        prev = torch.tensor([anchor], device=base.device)
    state = net.new_state(1) if net.args.markov_rank else None
    tokens, dists, logits_c = [], [], []
    for j in range(k):
        h = hidden[j : j + 1]
        if net.args.confidence:  # decided before token j is drawn
            logits_c.append(net.confidence_logit(h, prev))
        logits = base[j : j + 1].float()
        if net.args.markov_rank:
            bias, state = net.markov_step(prev, h, state, None if vocab is None else vocab.ids)
            logits = logits + bias
        if greedy:
            index = logits.argmax(dim=-1)
        else:
            q = probabilities(logits, params)
            index = (q / noise[j : j + 1]).argmax(dim=-1)  # a draw from q
            dists.append(
                q if vocab is None else vocab.to_full(q, net.args.backbone.layers.vocab_size)
            )
        prev = index if vocab is None else vocab.ids[index]
        tokens.append(prev)
    confidence = None
    if logits_c:
        z = torch.cat(logits_c)
        if calibration is not None:
            z = calibration.scale(z)
        confidence = torch.sigmoid(z)[None]
    return Draft(
        tokens=torch.cat(tokens)[None],
        probs=torch.cat(dists)[None] if dists else None,
        confidence=confidence,
    )


def race_noise(
    rows: int, vocab: int, generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Exp(1) noise for `rows` sampled Markov draws over `vocab` tokens."""
    return torch.empty(rows, vocab, device=device).exponential_(generator=generator)


def _fused(net: DSparkNet, base: torch.Tensor) -> bool:
    """The one-launch greedy kernel (kernels/markov.py): CUDA, Triton, vanilla head."""
    r = net.args.markov_rank
    return (
        base.is_cuda
        and backend() == "triton"
        and net.args.markov_kind == "vanilla"
        and r >= 4
        and r & (r - 1) == 0
    )


def _temperature_only(params: SamplingParams, width: int) -> bool:
    """Whether sampling filters nothing (no top-k below the width, no top-p): the kernel's
    sampled form; filtered sampling stays in the torch loop."""
    return (params.top_k == 0 or params.top_k >= width) and params.top_p >= 1.0


def _fused_draw(net, base, hidden, anchor, calibration, vocab, params, noise) -> Draft:
    from specgen.kernels.markov import markov_greedy_triton, markov_sample_triton

    w2 = net.markov_rows(None if vocab is None else vocab.ids)
    conf_w = net.conf_w if net.args.confidence else None
    conf_b = net.conf_b if net.args.confidence else None
    ids = None if vocab is None else vocab.ids
    args = (base, hidden, anchor, net.markov_w1, w2, ids, conf_w, conf_b)
    probs = None
    if params.greedy or noise is None:
        tokens, z = markov_greedy_triton(*args)
    else:
        k = base.shape[0]
        tokens, z, q = markov_sample_triton(*args, noise[:k], params.temperature)
        probs = q if vocab is None else vocab.to_full(q, net.args.backbone.layers.vocab_size)
        probs = probs[None]
    confidence = None
    if z is not None:
        confidence = torch.sigmoid(z if calibration is None else calibration.scale(z))[None]
    return Draft(tokens=tokens[None], probs=probs, confidence=confidence)


@register("dspark")
class DSparkMethod(BlockMethod):
    architectures = ("Qwen3DSparkModel", "Gemma4DSparkModel")
    training = DSparkTraining()
    export = EXPORT
    label = "DSpark"

    def __init__(
        self,
        net: DSparkNet,
        target: Transformer,
        block_size: int,
        draft_tokens: int | None = None,
        vocab: DraftVocab | None = None,
        *,
        calibration: Calibration | None = None,
        **settings: Any,
    ) -> None:
        super().__init__(net, target, block_size, draft_tokens, vocab, **settings)
        self.calibration = calibration  # per-position temperatures (`specgen calibrate`)

    @classmethod
    def load_net(cls, checkpoint: Checkpoint, target: Transformer, target_name: str) -> DSparkNet:
        return load_dspark(
            checkpoint.path, target=target, target_name=target_name, name=checkpoint.name
        )

    @classmethod
    def trained_block(cls, net: DSparkNet) -> int:
        return net.args.backbone.block_size

    @classmethod
    def extras(cls, path: Path, net: DSparkNet) -> dict[str, Any]:
        return {"calibration": load_calibration(path) if net.args.confidence else None}

    def draft_slots(self, block_size: int) -> int:
        return block_size - self.net.args.first_slot

    def uncalibrated(self, name: str) -> None:
        """Confidences from the head's raw logits from now on, to fit a calibration on
        (`specgen calibrate`); a drafter (`name`) without a confidence head is refused."""
        if not self.net.args.confidence:
            raise SpecgenError(f"{name} has no confidence head to calibrate")
        self.calibration = None

    def new_drafter(self, capacity: int) -> DSparkDrafter:
        return DSparkDrafter(self, capacity)


class DSparkDrafter(BlockDrafter):
    def __init__(self, method: DSparkMethod, capacity: int) -> None:
        # one kind of draft. Its confidences come only with the draft, which costs a drafter
        # forward; whether to draft at all is judged from earlier steps' acceptance instead,
        # and the confidences then trim the draft (a checkpoint without a confidence head
        # has its length settled before drafting, as DFlash)
        self.options = (DraftOption(confidences=bool(method.net.args.confidence)),)
        # each sampled step's races and the params it was built with, by (temperature,
        # top-k, top-p): allocated once, refilled before each draft (a graph reads them
        # where they are)
        self._races: dict[tuple, tuple[torch.Tensor, SamplingParams]] = {}
        super().__init__(method, capacity, method.net.backbone)

    def build_step(self, key: object, capture: bool) -> StaticBlockDraft:
        """A draft step with fixed shapes (see drafting/static_draft.py): the backbone, the
        head over the draft slots and the Markov draw, all on the device; greedy, or
        sampled with the filters `key` names (its races in `_races[key]`)."""
        if key == GREEDY:
            return self._step(SamplingParams(), None, capture)
        races, params = self._races[key]  # type: ignore[index]
        return self._step(params, races, capture)

    def _step(
        self, params: SamplingParams, noise: torch.Tensor | None, capture: bool
    ) -> StaticBlockDraft:
        def finish(hidden: torch.Tensor, anchor: torch.Tensor) -> Draft:
            return self._draw(hidden, anchor, self.max_draft_tokens, params, noise)

        return self._static_step(finish, capture)

    def _draw(
        self,
        hidden: torch.Tensor,  # [1, B, H]: the block's backbone outputs
        anchor: int | torch.Tensor,
        k: int,
        params: SamplingParams,
        noise: torch.Tensor | None,  # the races of a sampled draw (`race_noise`)
    ) -> Draft:
        """The first k slots' draft: their head logits, then the Markov draw."""
        first, vocab, backbone = self.net.args.first_slot, self.method.vocab, self.backbone
        slots = hidden[0, first : first + k]
        if vocab is None:
            base = backbone.head(self.target, slots)
        else:
            base = backbone.logits(vocab.logits(slots))
        return markov_draw(
            self.net, base, slots, anchor, params, None, self.method.calibration, vocab, noise
        )

    def _noise(self, generator: torch.Generator | None) -> torch.Tensor:
        """A sampled draft's races, for every slot whatever the draft's length, so that the
        generator advances the same in every path (eager, graph, sync, resident)."""
        return self._race_buffer().exponential_(generator=generator)

    def _race_buffer(self) -> torch.Tensor:  # [max drafts, draft vocabulary], unfilled
        vocab = self.method.vocab
        width = self.target.lm_head.shape[0] if vocab is None else vocab.ids.numel()
        return torch.empty(self.max_draft_tokens, width, device=self.target.device)

    def _sampled(
        self,
        anchor: int | torch.Tensor,
        start: int | torch.Tensor,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """A sampled draft from the fixed-shape step of these sampling filters, with the
        races drawn into its input buffer first: a CUDA graph with graphs on (one per
        filter setting), else the same step eagerly."""
        key = (params.temperature, params.top_k, params.top_p)
        if key not in self._races:
            self._races[key] = (self._race_buffer(), params)
        self._races[key][0].exponential_(generator=generator)  # the races `_noise` would draw
        return self.steps(key, anchor, start, k)

    @torch.inference_mode()
    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        k = min(max_tokens, self.max_draft_tokens)
        if k <= 0:
            return empty_draft(self.target.device)
        cache = self.context.ready()
        greedy = params.greedy or generator is None
        if greedy:
            draft = self._graphed(anchor, cache.length, k)
            if draft is not None:
                return draft
        elif self.steps.on:  # graphs on: the sampled step is one too
            return self._sampled(anchor, cache.length, k, params, generator)
        hidden = self.backbone.block_hidden(cache, self._block(anchor))
        return self._draw(hidden, anchor, k, params, None if greedy else self._noise(generator))

    @torch.inference_mode()
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the context length
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """`propose` for the device-resident loop."""
        if params.greedy or generator is None:
            return self._fixed(anchor, start, k)
        return self._sampled(anchor, start, k, params, generator)
