"""`--method dspark`: DeepSpec's DSpark drafter (block backbone + Markov head + confidence).

Each step runs the backbone once over [anchor, MASK x (g-1)] (context K/V cached and
rolled back with the target, as for DFlash), takes the LM-head logits of the draft slots,
then walks the slots left to right: add the Markov bias of the previous token, draw the
token (argmax at temperature 0; otherwise a sample from the corrected distribution after
the request's temperature / top-k / top-p, whose probabilities go to the verifier so
rejection sampling stays exact), and read the confidence head before the draw. The
confidences (per-position temperature-calibrated when `specgen calibrate` has fitted the
drafter) feed the verify-length scheduler.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specgen.config import SamplingParams
from specgen.drafting.base import Draft, DraftOption, empty_draft, register
from specgen.drafting.static_draft import BlockDrafter, StaticBlockDraft
from specgen.drafting.vocab import DraftVocab, load_draft_vocab
from specgen.engine.sampling import probabilities
from specgen.errors import SpecgenError
from specgen.hub import resolve_drafter
from specgen.kernels import backend
from specgen.models.dspark import DSparkNet, load_dspark
from specgen.scheduling.calibration import Calibration, load_calibration

if TYPE_CHECKING:
    from specgen.config import SpecConfig
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
) -> Draft:
    """Draw k draft tokens left to right through the Markov head. With `vocab`, `base`
    covers only its tokens ([k, V']) and so does every draw."""
    if (params.greedy or generator is None) and _fused(net, base):
        return _fused_greedy(net, base, hidden, anchor, calibration, vocab)
    k = base.shape[0]
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
        if params.greedy or generator is None:
            index = logits.argmax(dim=-1)
        else:
            q = probabilities(logits, params)
            index = torch.multinomial(q, 1, generator=generator)[:, 0]
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


def _fused_greedy(net, base, hidden, anchor, calibration, vocab) -> Draft:
    from specgen.kernels.markov import markov_greedy_triton

    w2 = net.markov_w2 if vocab is None else net.markov_w2[vocab.ids]
    conf_w = net.conf_w if net.args.confidence else None
    conf_b = net.conf_b if net.args.confidence else None
    ids = None if vocab is None else vocab.ids
    tokens, z = markov_greedy_triton(base, hidden, anchor, net.markov_w1, w2, ids, conf_w, conf_b)
    confidence = None
    if z is not None:
        confidence = torch.sigmoid(z if calibration is None else calibration.scale(z))[None]
    return Draft(tokens=tokens[None], confidence=confidence)


@register("dspark")
class DSparkMethod:
    architectures: tuple[str, ...] = ("Qwen3DSparkModel",)
    needs_drafter = True
    drafters_needed = 1

    def __init__(
        self,
        net: DSparkNet,
        target: Transformer,
        block_size: int,
        draft_tokens: int | None,
        calibration: Calibration | None = None,
        vocab: DraftVocab | None = None,
    ) -> None:
        self.net = net
        self.target = target
        self.block_size = block_size
        self.calibration = calibration
        self.vocab = vocab  # drafts come from these head rows only (drafting/vocab.py)
        slots = block_size - net.args.first_slot
        self.max_draft_tokens = min(slots, draft_tokens or slots)
        self.cuda_graphs = False  # greedy draft steps as CUDA graphs (set by `load` on CUDA)

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> DSparkMethod:
        source = spec.drafter
        if source is None:
            raise SpecgenError(f"no dspark drafter given for {target_name}; pass --drafter")
        if notify:
            notify(f"loading DSpark drafter {source}")
        path = resolve_drafter(source)
        net = load_dspark(path, target=target, target_name=target_name, name=source)
        trained = net.args.backbone.block_size
        block = spec.block_size or trained
        if block > trained:
            raise SpecgenError(
                f"--block-size {block} exceeds the block {trained} {source} was trained with "
                "(smaller blocks work, larger ones do not)"
            )
        calibration = load_calibration(path) if net.args.confidence else None
        vocab = load_draft_vocab(path, target.lm_head, source)
        method = cls(net, target, block, spec.draft_tokens, calibration, vocab)
        method.cuda_graphs = spec.cuda_graphs and target.device.type == "cuda"
        return method

    def new_drafter(self, capacity: int) -> DSparkDrafter:
        return DSparkDrafter(self, capacity)


class DSparkDrafter(BlockDrafter):
    # one kind of draft. Its confidences come only with the draft, which costs a drafter
    # forward; whether to draft at all is judged from earlier steps' acceptance instead.
    options = (DraftOption(),)

    def __init__(self, method: DSparkMethod, capacity: int) -> None:
        self.method = method
        self.net, self.target = method.net, method.target
        self.max_draft_tokens = method.max_draft_tokens
        self.taps = self.net.args.backbone.target_layer_ids
        self.backbone = backbone = self.net.backbone
        self.context = self.new_context(capacity)
        self._masks = [self.net.args.backbone.mask_token_id] * (method.block_size - 1)
        self.static: StaticBlockDraft | None = None  # the greedy draft step as a CUDA graph
        if method.cuda_graphs and backbone.static_ready:
            self.static = self.static_draft(capture=True)

    def static_draft(self, *, capture: bool) -> StaticBlockDraft:
        """The greedy draft step with fixed shapes (see drafting/static_draft.py): the
        backbone, the head over the draft slots and the Markov draw, all on the device."""

        def finish(hidden: torch.Tensor, anchor: torch.Tensor) -> Draft:
            return self._draw(hidden, anchor, self.max_draft_tokens, SamplingParams(), None)

        backbone = self.net.backbone
        return StaticBlockDraft(self.context, backbone, self.target, self._masks, finish, capture)

    def _draw(
        self,
        hidden: torch.Tensor,  # [1, B, H]: the block's backbone outputs
        anchor: int | torch.Tensor,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """The first k slots' draft: their head logits, then the Markov draw."""
        first, vocab = self.net.args.first_slot, self.method.vocab
        slots = hidden[0, first : first + k]
        base = self.target.head(slots) if vocab is None else vocab.logits(slots)
        return markov_draw(
            self.net, base, slots, anchor, params, generator, self.method.calibration, vocab
        )

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
        if params.greedy or generator is None:
            draft = self._graphed(anchor, cache.length, k)
            if draft is not None:
                return draft
        ids = torch.tensor([[anchor, *self._masks]], device=self.target.device)
        block = self.target.embed_tokens(ids)
        hidden = self.net.backbone.block_hidden(cache, block)
        return self._draw(hidden, anchor, k, params, generator)

    @torch.inference_mode()
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the context length
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """`propose` for the device-resident loop. A sampled draft draws from the host's
        generator, so only its backbone has fixed shapes and it runs eagerly."""
        if params.greedy or generator is None:
            return self._fixed(anchor, start, k)
        hidden = self._eager_step().hidden(anchor, start)
        return self._draw(hidden, anchor.view(1), k, params, generator)
