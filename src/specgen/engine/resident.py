"""The speculative loop with its state on the device: the host queues step N+1 before it
reads step N (the DFlash / SGLang "spec v2" form; what `--engine auto` runs on CUDA).

engine/loop.py reads each step's accept count and bonus before it can build the next
step, so the device idles while the host reads, decides and launches. Here what the next
step needs never leaves the device:
- `length` [1] int64: the committed length of the target cache and the drafter's context;
- `anchor` [1, 1] int64: the last committed token (the step before's bonus).
A step is queued from them alone: the drafter drafts after `length` from `anchor`
(drafting/static_draft.py), the target verifies [anchor, drafts] at `length`
(`forward_static`: K/V written at device positions), the verifier leaves the accept count
and the bonus on the device, the drafter's context gets the features of every verified
position (those past the accepted ones lie beyond the new length: dead, overwritten
later), and `length += accepted + 1`, `anchor = bonus`. The step's accept count, bonus and
drafts are copied to the host asynchronously (an event marks them ready). Only then does
the host read the step before, long finished, and cut, record and hand it over, while the
device runs the step just queued. With CUDA graphs the target's step and the greedy draft
step are each one replay.

Exactness. The device computes nothing from the host's late view; the host decides only
the lengths of drafts and verifies, from what it knows:
- A step is queued only if its longest draft is sure to fit: the step in flight commits at
  most its verify length + 1 tokens, and the room left after that (under
  `max_new_tokens` and the context) must hold a full draft. Otherwise the host first
  drains the step in flight and then decides exactly as engine/loop.py would. So with
  every draft verified whole (`--verify-policy full`) and one drafter, every draft and
  verify has the sync loop's length, the generator's draws come in the same order, and
  even seeded sampling gives the sync loop's tokens.
- The cost scheduler decides from acceptance recorded a step later than in the sync loop,
  a confidence drafter's (DSpark's) verify length is chosen from that drafter's previous
  confidences, already on the host (the DSpark production form), not from its current
  ones, and stacked's selector (under the other policies) learns a step late too. Each
  choice is made before the tokens it judges are verified, so greedy output is still the
  target's and sampled output has the target's distribution; seeded samples may differ
  from the sync loop's, since the choices do.
- Stops are found a step late: the host cuts the output at the stop token, at
  `max_new_tokens` or at the context limit exactly as the sync loop does, sets both
  caches' committed length to that step's, and drops the step in flight (all it wrote lies
  past that length). A chat continues from there.

Host syncs: the prefill's first token (once per answer), and per step the event of the
step before, which the device has finished by the time the host waits on it. The drafts,
accept count, bonus and confidences travel together in that one copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from specgen.config import SamplingParams
from specgen.drafting.base import Draft, Drafter, empty_draft
from specgen.engine.events import StepEvent
from specgen.engine.loop import cut, draft_room, prefill
from specgen.engine.sampling import sample
from specgen.models.kv_cache import StaticKVCache
from specgen.models.transformer import ForwardOutput
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.verify import verify_draft


class StaticForward(Protocol):
    """The target's step with its position in device memory (Transformer, GraphedForward)."""

    def __call__(self, tokens, cache, *, taps=(), num_logits=None, pad=None) -> ForwardOutput:
        """The eager forward (the prefill)."""

    def forward_static(
        self, tokens: torch.Tensor, cache: StaticKVCache, start: torch.Tensor, *, taps=()
    ) -> ForwardOutput:
        """A step at the device-resident position `start`."""


def resident_ready(drafter: Drafter) -> bool:
    """Whether `drafter` can draft from device-resident state (fixed-shape draft steps)."""
    return bool(getattr(drafter, "resident", False))


class _HostCopy:
    """Device tensors copied to the host without waiting; `wait` when they are needed."""

    def __init__(self, ids: torch.Tensor, confidence: torch.Tensor | None) -> None:
        # non_blocking from CUDA lands in pinned memory; the event says when it is there
        self.ids = ids.to("cpu", non_blocking=True)
        self.confidence = None
        if confidence is not None:
            self.confidence = confidence.float().to("cpu", non_blocking=True)
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
    drafter: Drafter,
    new_ids: list[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    scheduler: VerifyScheduler | None = None,
) -> Iterator[StepEvent]:
    """`engine.loop.generate_speculative` with the step state on the device (see above).
    `drafter` must be `resident_ready`."""
    generator, anchor_t, first = prefill(
        forward, cache, drafter, new_ids, params, max_new_tokens, stop_ids
    )
    yield first
    if first.finish is not None:
        return
    produced, length = len(first.tokens), cache.length  # what the host knows
    device = anchor_t.device
    cache.make_finite()  # the static step's masked attention reads dead positions
    drafter.begin_resident()
    length_t = torch.tensor([length], device=device)
    stale: dict[int, tuple[float, ...]] = {}  # each bucket's latest confidences, on the host
    pending: _Step | None = None

    def finish_step(step: _Step) -> StepEvent:
        """The host's half of a step whose results have arrived."""
        nonlocal produced, length
        ids, confidence = step.copy.wait()
        accepted, bonus, proposal = ids[0], ids[1], ids[2:]
        drafted = proposal[: step.draft.length]
        if scheduler is not None:
            scheduler.record(step.draft, accepted, len(proposal))
        if confidence:
            stale[step.draft.bucket] = confidence
        length += accepted + 1  # the anchor and the accepted drafts
        cache.assume_written(length)
        drafter.assume(length, accepted + 1 if step.draft.length else None)
        tokens, finish = cut([*drafted[:accepted], bonus], produced, max_new_tokens, stop_ids)
        produced += len(tokens)
        if finish is None and cache.free == 0:  # nowhere to put the next anchor
            finish = "context"
        return StepEvent(
            tokens=tuple(tokens),
            drafted=len(drafted),
            accepted=accepted,
            finish=finish,
            proposal=tuple(proposal),
            bonus=bonus,
            confidence=confidence,
            drafter=step.draft.source,
        )

    try:
        while True:
            ahead = 0 if pending is None else pending.draft.length + 1  # its most commits
            room = min(max_new_tokens - produced - ahead, cache.free - ahead) - 1
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
            if draft.length:
                verdict = verify_draft(out.logits, draft, params, generator)
                accepted_t, bonus_t = verdict.accepted[:1], verdict.bonus[:1]
            else:  # nothing to verify: a plain decoding step
                bonus_t = sample(out.logits[:, -1], params, generator)
                accepted_t = torch.zeros_like(bonus_t)
            drafter.observe_at(out.taps, length_t)
            ids = torch.cat([accepted_t, bonus_t, proposal.tokens[0].to(bonus_t.dtype)])
            confidence = None if proposal.confidence is None else proposal.confidence[0]
            step = _Step(_HostCopy(ids, confidence), draft)
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
