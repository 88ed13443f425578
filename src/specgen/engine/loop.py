"""The speculative decoding loop: readable and synchronous, the reference for every fast path.

    prefill -> first token
    repeat:  draft up to k tokens after the anchor
             one target forward over [anchor, d1..dk]
             verify -> accepted a, bonus
             keep anchor + a drafts in the target cache (roll back the rest)
             tell the drafter what was committed; the bonus is the next anchor

Every step commits a + 1 tokens. Stop tokens inside the committed run cut the output there;
`max_new_tokens` caps the draft length so no step overshoots; the draft also shrinks to
fit the context, and when no room is left for the next anchor the answer ends with finish
"context". Before drafting, the cost scheduler may pick which kind of draft to make (the
stacked drafters) or skip drafting when no draft is expected to pay for itself (a plain
decoding step); it decides from earlier steps only. Nothing here looks at the tokens
it is judging before verifying them, so greedy output equals `generate_ar`'s and sampled
output has the target's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from specgen.core import clock
from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, empty_draft
from specgen.core.events import StepEvent
from specgen.drafting.base import Drafter
from specgen.engine.answer import Answer, reported
from specgen.engine.prefill import prefill_forward
from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import Transformer
from specgen.scheduling.scheduler import VerifyScheduler
from specgen.verify import verify_draft
from specgen.verify.constraint import Constraint, masked
from specgen.verify.logprobs import logprobs_of
from specgen.verify.penalties import Penalties, penalised
from specgen.verify.sampling import make_generator, sample

# an answer's constraint and its cancel check, handed to `prefill` together
Guide = tuple[Constraint | None, Callable[[], bool] | None] | None


def _confidences(draft: Draft) -> tuple[float, ...]:
    # sync: tiny, next to the drafted tokens' own copy; stats and traces need host floats
    return () if draft.confidence is None else tuple(draft.confidence[0].tolist())


def prefill(
    model: Transformer,
    cache: StaticKVCache,
    drafter: Drafter,
    new_ids: list[int],
    params: SamplingParams,
    answer: Answer,
    history: Sequence[int] = (),
    guide: Guide = None,
) -> tuple[torch.Generator, torch.Tensor, StepEvent, Penalties | None]:
    """Prefill `new_ids` (the drafter observes them) after `history` (what the cache already
    holds) and draw the first token: the request's generator, the first token as the
    anchor on the device [1, 1], the first step's event (its `bonus` is the anchor), and
    the answer's penalty counts (None: no penalties). `guide`: the answer's constraint
    and a cancel check asked between prefill chunks (engine/prefill.py)."""
    constraint, cancel = guide or (None, None)
    generator = make_generator(params, model.device)
    out = prefill_forward(
        model, cache, new_ids, taps=drafter.taps, observe=drafter.observe, cancel=cancel
    )
    logits = out.logits[:, -1]  # [1, V]
    penalties = Penalties.start(params, [*history, *new_ids], logits)
    first = sample(masked(constraint, penalised(penalties, logits)), params, generator)
    if penalties is not None:
        penalties.count(first)
    anchor = int(first)  # sync: first token
    tokens, finish = answer.commit([anchor], cache.free)
    if constraint is not None:
        constraint.commit(tokens)
    logprobs = logprobs_of(logits, reported([anchor], tokens, finish), params.logprobs)
    event = StepEvent(tokens=tokens, finish=finish, bonus=anchor, logprobs=logprobs)
    return generator, first.view(1, 1), event, penalties


def draft_room(
    drafter: Drafter,
    scheduler: VerifyScheduler | None,
    room: int,
    context: int,
    anchor: int | None = None,
    params: SamplingParams | None = None,
) -> int:
    """The drafts this step may have: `room`, or what the scheduler plans before drafting
    (0: a plain decoding step); its pick among the drafter's options (at `anchor` in an
    answer sampled with `params`, where the host knows them) is passed on."""
    if scheduler is None or room <= 0 or not drafter.options:
        return room
    options = drafter.options
    if anchor is not None and params is not None:
        options = drafter.options_at(anchor, params)
    bucket, room = scheduler.plan(options, context, room)
    if room > 0:
        drafter.select(bucket)
    return room


def propose(drafter: Drafter, scheduler: VerifyScheduler | None, anchor: int, room: int,
            params: SamplingParams, generator: torch.Generator | None) -> Draft:  # fmt: skip
    """`drafter`'s draft of `room` tokens after `anchor`, its time told to the scheduler
    (a probe's paces the probes)."""
    began = clock.now()
    proposal = drafter.propose(anchor, room, params, generator)
    if scheduler is not None:
        scheduler.drafted(clock.now() - began)
    return proposal


def kept_taps(taps: dict[int, torch.Tensor], accepted: int, verified: int) -> dict:
    """A verify block's tapped rows that stay: the anchor's and the accepted drafts'."""
    if accepted == verified:  # every row (a plain step: its one row)
        return taps
    return {layer: h[:, : 1 + accepted] for layer, h in taps.items()}


@torch.inference_mode()
def generate_speculative(
    model: Transformer,
    cache: StaticKVCache,
    drafter: Drafter,
    new_ids: list[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    scheduler: VerifyScheduler | None = None,
    history: Sequence[int] = (),
    constraint: Constraint | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[StepEvent]:
    """Prefill `new_ids` after what `cache` (and `drafter`) already hold (`history`: those
    tokens, for the repetition penalty), then speculate. `constraint` masks every row the
    target scores (verify/constraint.py); `cancel` is asked between prefill chunks.

    `scheduler`, if given, plans each draft and shortens it to the verify length with the
    best expected tokens per second (from earlier steps only); without it every draft is
    verified whole. Penalties apply to every verified row as plain decoding would apply
    them (verify/penalties.py); logprobs come from the same rows, unpenalised.
    """
    device = model.device
    answer = Answer(max_new_tokens, stop_ids)
    generator, anchor_t, first, penalties = prefill(
        model, cache, drafter, new_ids, params, answer, history, (constraint, cancel)
    )
    yield first
    anchor, finish = first.bonus, first.finish
    while finish is None:
        room = min(answer.room, cache.free - 1)  # drafts that can matter
        room = draft_room(drafter, scheduler, room, cache.length, anchor, params)
        proposal = empty_draft(device)
        if room > 0:
            proposal = propose(drafter, scheduler, anchor, room, params, generator)
        draft = proposal if scheduler is None else scheduler.trim(proposal, cache.length)
        start = cache.length
        # The block is built on the device from the device-resident anchor and the drafts
        # are read back only after the verify forward is queued, so on a GPU the device
        # goes straight from drafting to verifying while the host waits for the drafts.
        drafts = draft.tokens.to(device=anchor_t.device, dtype=anchor_t.dtype)
        block = torch.cat([anchor_t, drafts], dim=1) if draft.length else anchor_t
        began = clock.now()
        out = model(block, cache, taps=drafter.taps)
        # sync: the drafts are needed on the host anyway
        verified = draft.tokens[0].tolist() if draft.length else []
        scored = masked(constraint, penalised(penalties, out.logits, drafts), verified)
        if verified:
            verdict = verify_draft(scored, draft, params, generator)
            bonus_t = verdict.bonus[:1].view(1, 1)
            accepted, bonus = int(verdict.accepted[0]), int(verdict.bonus[0])  # sync
        else:  # nothing to verify: a plain decoding step
            bonus_t = sample(scored[:, -1], params, generator).view(1, 1)
            accepted, bonus = 0, int(bonus_t)  # sync
        if penalties is not None:
            penalties.commit(drafts[0], accepted, bonus_t)
        if scheduler is not None:  # (the forward, its sampling and the syncs: what it cost)
            scheduler.timed(start, len(verified), clock.now() - began)
            scheduler.record(draft, accepted, proposal.length)
        cache.rollback(start + 1 + accepted)  # anchor + accepted drafts stay
        kept = kept_taps(out.taps, accepted, len(verified))
        drafter.observe([anchor, *verified[:accepted]], kept)
        step = [*verified[:accepted], bonus]
        tokens, finish = answer.commit(step, cache.free)
        if constraint is not None:
            constraint.commit(tokens)
        yield StepEvent(
            tokens=tokens,
            verified=len(verified),
            accepted=accepted,
            finish=finish,
            proposal=tuple(verified if draft is proposal else proposal.tokens[0].tolist()),
            bonus=bonus,
            confidence=_confidences(proposal),
            drafter=proposal.source,
            # row i of the verify pass: the distribution token i was chosen from
            logprobs=logprobs_of(out.logits[0], reported(step, tokens, finish), params.logprobs),
        )
        anchor, anchor_t = bonus, bonus_t
