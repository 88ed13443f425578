"""One answer's decoding, a step at a time, split at the target forward so that a caller
can run several answers' forwards together (engine/batch.py): `plan` says which rows the
target must run for this answer (a prefill chunk, or [anchor, drafts]), the caller runs
them, and `finish` takes the forward's output, verifies and commits.

The steps are engine/loop.py's (the readable reference) and, without a drafter,
engine/ar.py's plain decoding: the same prefill chunks, draws from the same generator in
the same order, the same cache and drafter bookkeeping. So an answer stepped here is the
answer those loops give, token for token and draw for draw, whatever else shares its
steps (tests/test_batch_engine.py holds it to them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft, empty_draft
from specgen.core.errors import Cancelled
from specgen.core.events import StepEvent
from specgen.engine.answer import Answer, reported
from specgen.engine.loop import draft_room, kept_taps, propose
from specgen.engine.prefill import CHUNK, bounds
from specgen.engine.session import Session
from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import ForwardOutput
from specgen.verify import verify_draft
from specgen.verify.constraint import Constraint, masked
from specgen.verify.logprobs import logprobs_of
from specgen.verify.penalties import Penalties, penalised
from specgen.verify.sampling import make_generator, sample


@dataclass(frozen=True)
class Rows:
    """What one answer asks of the target in a step: `tokens` after what `cache` holds."""

    tokens: list[int]
    cache: StaticKVCache
    forward: Callable[..., ForwardOutput]  # the session's: the model, or its CUDA graphs
    taps: tuple[int, ...]
    num_logits: int | None  # 1 for a prefill chunk; None: every row (a verify block)
    device: torch.device

    @property
    def prefill(self) -> bool:
        return self.num_logits is not None


class Stepper:
    """An answer on `session` after `new_ids` (what `session.prepare` left to prefill)."""

    def __init__(
        self,
        session: Session,
        new_ids: Sequence[int],
        *,
        params: SamplingParams,
        max_new_tokens: int,
        stop_ids: frozenset[int],
        constraint: Constraint | None = None,
        cancel: Callable[[], bool] | None = None,
        chunk: int = CHUNK,
    ) -> None:
        self.session = session
        self.cache = session.cache
        self.drafter = session.drafter
        self.params = params
        self.constraint = constraint
        self.cancel = cancel
        self.history = list(session.ids)  # the prompt's part the cache already holds
        self.new_ids = list(new_ids)
        self.answer = Answer(max_new_tokens, stop_ids)
        self.generator = make_generator(params, session.device)
        self.chunks = deque(bounds(len(self.new_ids), chunk))
        self.penalties: Penalties | None = None
        self.anchor = 0
        self.anchor_t: torch.Tensor | None = None  # [1, 1] on the device
        self.finish_reason: str | None = None
        self._draft: Draft | None = None  # this step's, as verified
        self._proposal: Draft | None = None  # and as drafted
        self._draft_ids: list[int] = []  # its tokens on the host, read back once in `plan`
        self._start = 0  # the cache length before this step's forward
        # False: this step decodes without drafting (a batch whose drafts have not been
        # paying, scheduling/guard.py); the drafter still sees every committed token
        self.may_draft = True

    @property
    def scheduler(self):
        return self.session.scheduler

    @property
    def seeded(self) -> bool:
        """A seeded sampling answer: its draws must not depend on anything but its seed
        and conversation (so, in a batch, nothing the others do)."""
        return self.params.seed is not None and not self.params.greedy

    @property
    def prefilling(self) -> bool:
        return bool(self.chunks)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def context(self) -> int:
        """Tokens in the target cache (the anchor not among them)."""
        return self.cache.length

    @property
    def prompt_left(self) -> int:
        """Prompt tokens still to read."""
        return sum(end - start for start, end in self.chunks)

    def rows_now(self) -> int:
        """The rows this step runs before any drafts: a prefill chunk's, else 1."""
        if self.chunks:
            start, end = self.chunks[0]
            return end - start
        return 1

    @property
    def drafts(self) -> bool:
        """Whether this step may draft: decoding, with a drafter and room for a draft."""
        return not self.chunks and self.drafter is not None and self._room() > 0

    def _room(self) -> int:
        return min(self.answer.room, self.cache.free - 1)  # drafts that can matter

    def plan(self) -> Rows:
        """This step's rows: the next prefill chunk, or the anchor and what is drafted
        (the scheduler, with the prices it was handed, decides how much)."""
        drafter, taps = self.drafter, self.drafter.taps if self.drafter is not None else ()
        session, device = self.session, self.session.device
        self._start = self.cache.length
        if self.chunks:
            start, end = self.chunks[0]
            if self.cancel is not None and self.cancel():
                raise Cancelled(f"cancelled after {start} of {len(self.new_ids)} prompt tokens")
            ids = self.new_ids[start:end]
            return Rows(ids, self.cache, session.forward, taps, 1, device)
        proposal = empty_draft(device)
        if drafter is not None and self.may_draft:
            room = draft_room(  # at the anchor: a free drafter is offered where it has a draft
                drafter, self.scheduler, self._room(), self.cache.length, self.anchor, self.params
            )
            if room > 0:
                proposal = propose(
                    drafter, self.scheduler, self.anchor, room, self.params, self.generator
                )
        scheduler = self.scheduler
        draft = proposal if scheduler is None else scheduler.trim(proposal, self.cache.length)
        self._proposal, self._draft = proposal, draft
        # sync: the drafts are needed on the host anyway
        verified = self._draft_ids = draft.tokens[0].tolist() if draft.length else []
        return Rows([self.anchor, *verified], self.cache, session.forward, taps, None, device)

    def finish(self, out: ForwardOutput) -> StepEvent | None:
        """Commit this step from the forward over its rows; None after a prefill chunk
        that is not the last (nothing is drawn yet)."""
        if self.chunks:
            return self._prefilled(out)
        return self._verified(out)

    def _prefilled(self, out: ForwardOutput) -> StepEvent | None:
        start, end = self.chunks.popleft()
        if self.drafter is not None:  # its context mirrors the cache, chunk by chunk
            self.drafter.observe(self.new_ids[start:end], out.taps)
        if self.chunks:
            return None
        params, constraint = self.params, self.constraint
        logits = out.logits[:, -1]  # [1, V]
        self.penalties = Penalties.start(params, [*self.history, *self.new_ids], logits)
        scored = masked(constraint, penalised(self.penalties, logits))
        first = sample(scored, params, self.generator)
        if self.penalties is not None:
            self.penalties.count(first)
        self.anchor = int(first)  # sync: first token
        self.anchor_t = first.view(1, 1)
        tokens, finish = self.answer.commit([self.anchor], self.cache.free)
        if constraint is not None:
            constraint.commit(tokens)
        logprobs = logprobs_of(logits, reported([self.anchor], tokens, finish), params.logprobs)
        self.finish_reason = finish
        return StepEvent(tokens=tokens, finish=finish, bonus=self.anchor, logprobs=logprobs)

    def _verified(self, out: ForwardOutput) -> StepEvent:
        draft, proposal = self._draft, self._proposal
        assert draft is not None and proposal is not None and self.anchor_t is not None
        params, constraint, penalties = self.params, self.constraint, self.penalties
        verified = self._draft_ids
        drafts = draft.tokens.to(device=self.anchor_t.device, dtype=self.anchor_t.dtype)
        scored = masked(constraint, penalised(penalties, out.logits, drafts), verified)
        if verified:
            verdict = verify_draft(scored, draft, params, self.generator)
            bonus_t = verdict.bonus[:1].view(1, 1)
            accepted, bonus = int(verdict.accepted[0]), int(verdict.bonus[0])  # sync
        else:  # nothing to verify: a plain decoding step
            bonus_t = sample(scored[:, -1], params, self.generator).view(1, 1)
            accepted, bonus = 0, int(bonus_t)  # sync
        if penalties is not None:
            penalties.commit(drafts[0], accepted, bonus_t)
        if self.scheduler is not None:
            self.scheduler.record(draft, accepted, proposal.length)
        self.cache.rollback(self._start + 1 + accepted)  # anchor + accepted drafts stay
        if self.drafter is not None:
            kept = kept_taps(out.taps, accepted, len(verified))
            self.drafter.observe([self.anchor, *verified[:accepted]], kept)
        step = [*verified[:accepted], bonus]
        tokens, finish = self.answer.commit(step, self.cache.free)
        if constraint is not None:
            constraint.commit(tokens)
        self.anchor, self.anchor_t, self.finish_reason = bonus, bonus_t, finish
        self._draft = self._proposal = None
        return StepEvent(
            tokens=tokens,
            verified=len(verified),
            accepted=accepted,
            finish=finish,
            proposal=tuple(verified if draft is proposal else proposal.tokens[0].tolist()),
            bonus=bonus,
            confidence=_confidences(proposal),
            drafter=proposal.source,
            logprobs=logprobs_of(out.logits[0], reported(step, tokens, finish), params.logprobs),
        )


def _confidences(draft: Draft) -> tuple[float, ...]:
    # sync: tiny, next to the drafted tokens' own copy; stats and traces need host floats
    return () if draft.confidence is None else tuple(draft.confidence[0].tolist())
