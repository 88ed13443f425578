"""The speculative loop with its state on the device: the host queues step N+1 before it
reads step N (the DFlash / SGLang "spec v2" form; what `--engine auto` runs on CUDA).

What the next step needs never leaves the device: `length` [1] (the committed length of
the target cache and the drafter's context) and `anchor` [1, 1]. A step is queued from
them alone (draft after `length` from `anchor`, verify [anchor, drafts] at `length`, the
drafter's context written for every verified position, `length += accepted + 1`,
`anchor = bonus`); its results are copied to the host asynchronously, and the host then
reads the step before, long finished, while the device runs this one.

Exactness: the device computes nothing from the host's late view; the host decides only
lengths, from what it knows. A step is queued only if its longest draft is sure to fit
after the step in flight; otherwise the host drains that step first and decides as
engine/loop.py would. So with every draft verified whole and one drafter it makes the
sync loop's steps exactly (seeded sampling included); under the cost policy decisions use
acceptance a step older and a confidence drafter's previous confidences, made before the
tokens they judge, so the output keeps the target's distribution (seeded samples can
differ from the sync loop's). Stops are found a step late and cut exactly; both caches are
left at the handed-over length. docs/design.md has the longer story.

Host syncs: the prefill's first token, and per step the event of the step before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, empty_draft
from specgen.core.events import StepEvent
from specgen.drafting.base import ResidentDrafter
from specgen.engine.answer import Answer, reported
from specgen.engine.loop import draft_room, prefill
from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import ForwardOutput
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.verify import verify_draft
from specgen.verify.logprobs import RowLogprobs, row_logprobs
from specgen.verify.penalties import penalised
from specgen.verify.sampling import sample


class StaticForward(Protocol):
    """The target's step with its position in device memory (Transformer, GraphedForward)."""

    def __call__(self, tokens, cache, *, taps=(), num_logits=None, pad=None) -> ForwardOutput:
        """The eager forward (the prefill)."""

    def forward_static(
        self, tokens: torch.Tensor, cache: StaticKVCache, start: torch.Tensor, *, taps=()
    ) -> ForwardOutput:
        """A step at the device-resident position `start`."""


class _HostCopy:
    """Device tensors copied to the host without waiting; `wait` when they are needed."""

    def __init__(
        self,
        ids: torch.Tensor,
        confidence: torch.Tensor | None,
        logprobs: RowLogprobs | None = None,
    ) -> None:
        # non_blocking from CUDA lands in pinned memory; the event says when it is there
        self.ids = ids.to("cpu", non_blocking=True)
        self.confidence = None
        if confidence is not None:
            self.confidence = confidence.float().to("cpu", non_blocking=True)
        self.logprobs = None if logprobs is None else logprobs.to_host(non_blocking=True)
        self.event = None
        if ids.is_cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def wait(self) -> tuple[list[int], tuple[float, ...]]:
        if self.event is not None:
            self.event.synchronize()  # sync: the step before's results, long computed
        confidence = () if self.confidence is None else tuple(self.confidence.tolist())
        return self.ids.tolist(), confidence


@dataclass
class _Step:
    """A queued step, as the host knows it until its results arrive."""

    copy: _HostCopy  # [accepted, bonus, *proposal] and the proposal's confidences
    draft: Draft  # what was verified: the step commits at most its length + 1 tokens


@torch.inference_mode()
def generate_resident(
    forward: StaticForward,
    cache: StaticKVCache,
    drafter: ResidentDrafter,
    new_ids: list[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    scheduler: VerifyScheduler | None = None,
    history: Sequence[int] = (),
    cancel: Callable[[], bool] | None = None,
) -> Iterator[StepEvent]:
    """`engine.loop.generate_speculative` with the step state on the device (see above);
    the penalty counts stay there too, and logprobs ride the step's copy to the host.
    A constrained answer takes the host loop (its masks need each step's tokens)."""
    answer = Answer(max_new_tokens, stop_ids)
    generator, anchor_t, first, penalties = prefill(
        forward, cache, drafter, new_ids, params, answer, history, (None, cancel)
    )
    yield first
    if first.finish is not None:
        return
    length = cache.length  # what the host knows
    device = anchor_t.device
    cache.make_finite()  # the static step's masked attention reads dead positions
    drafter.begin_resident()
    length_t = torch.tensor([length], device=device)
    stale: dict[int, tuple[float, ...]] = {}  # each bucket's latest confidences, on the host
    pending: _Step | None = None

    def finish_step(step: _Step) -> StepEvent:
        """The host's half of a step whose results have arrived."""
        nonlocal length
        ids, confidence = step.copy.wait()
        accepted, bonus, proposal = ids[0], ids[1], ids[2:]
        verified = proposal[: step.draft.length]
        if scheduler is not None:
            scheduler.record(step.draft, accepted, len(proposal))
        if confidence:
            stale[step.draft.bucket] = confidence
        length += accepted + 1  # the anchor and the accepted drafts
        cache.assume_written(length)
        drafter.assume(length)
        committed = [*verified[:accepted], bonus]
        tokens, finish = answer.commit(committed, cache.free)
        rows = step.copy.logprobs
        return StepEvent(
            tokens=tokens,
            verified=len(verified),
            accepted=accepted,
            finish=finish,
            proposal=tuple(proposal),
            bonus=bonus,
            confidence=confidence,
            drafter=step.draft.source,
            logprobs=() if rows is None else rows.tokens(reported(committed, tokens, finish)),
        )

    try:
        while True:
            ahead = 0 if pending is None else pending.draft.length + 1  # its most commits
            room = min(answer.room - ahead, cache.free - ahead - 1)
            if pending is not None and room < drafter.max_draft_tokens:
                event = finish_step(pending)  # drain: decide the next step exactly
                pending = None
                yield event
                if event.finish is not None:
                    return
                continue
            draft = empty_draft(device)
            proposal = draft
            room = draft_room(drafter, scheduler, room, length)
            if room > 0:
                k = min(room, drafter.max_draft_tokens)
                proposal = drafter.draft_at(anchor_t, length_t, k, params, generator)
                draft = proposal
                if scheduler is not None:
                    draft = scheduler.trim(proposal, length, stale.get(proposal.bucket, ()))
            block = torch.cat([anchor_t, draft.tokens.to(anchor_t.dtype)], dim=1)
            out = forward.forward_static(block, cache, length_t, taps=drafter.taps)
            drafts = draft.tokens.to(anchor_t.device)
            scored = penalised(penalties, out.logits, drafts)
            if draft.length:
                verdict = verify_draft(scored, draft, params, generator)
                accepted_t, bonus_t = verdict.accepted[:1], verdict.bonus[:1]
            else:  # nothing to verify: a plain decoding step
                bonus_t = sample(scored[:, -1], params, generator)
                accepted_t = torch.zeros_like(bonus_t)
            if penalties is not None:
                penalties.commit(drafts[0], accepted_t, bonus_t)
            drafter.observe_at(block, out.taps, length_t)
            ids = torch.cat([accepted_t, bonus_t, proposal.tokens[0].to(bonus_t.dtype)])
            confidence = None if proposal.confidence is None else proposal.confidence[0]
            rows = _logprob_rows(out.logits[0], drafts[0], accepted_t, bonus_t, params)
            step = _Step(_HostCopy(ids, confidence, rows), draft)
            length_t = length_t + accepted_t + 1
            anchor_t = bonus_t.view(1, 1)
            if pending is not None:  # the step before: done by now, read while this runs
                event = finish_step(pending)
                pending = step
                yield event
                if event.finish is not None:
                    return
            pending = step
    finally:
        # whatever the exit (a stop, or the caller closing the stream): the caches hold
        # exactly the steps handed over; a step still in flight wrote only past them
        cache.assume_written(length)
        drafter.assume(length)


def _logprob_rows(
    logits: torch.Tensor,  # [k+1, V] the step's raw rows
    drafts: torch.Tensor,  # [k] verified
    accepted: torch.Tensor,  # [1] on the device
    bonus: torch.Tensor,  # [1]
    params: SamplingParams,
) -> RowLogprobs | None:
    """Every row's logprobs for the token the step commits there (d_{i+1} before the
    bonus's row, the bonus at it; rows past it are never read), without waiting for the
    host to learn `accepted`."""
    if params.logprobs is None:
        return None
    rows = torch.arange(logits.shape[0], device=logits.device)
    chosen = torch.cat([drafts.to(bonus.dtype), bonus])
    chosen = torch.where(rows == accepted, bonus, chosen)
    return row_logprobs(logits, chosen, params.logprobs)
