"""Several answers' steps at once: each step, every answer in the batch plans its rows (a
prefill chunk, or its anchor and the drafts its scheduler decided on), the target runs
them all, and each answer verifies and commits its own (engine/stepper.py).

Drafting is decided per batch: before an answer plans, its scheduler is handed the prices
of a step shared with the rows planned so far (scheduling/batch.py), so it drafts only
when the extra rows are expected to pay for the whole batch; alone, the prices are the
table's and it decides as it always has. Who decides first turns each step, so no answer
always sees the others' drafts already in the price. A decision depends on the batch
(and, as alone, on the measured costs), never on the tokens being judged, so every
answer stays lossless. A seeded sampling answer decides as if alone: which draws fall on
which token depends on its verify lengths, and a seeded answer must depend on its
conversation and seed only (scheduling/learning.py), whatever else shares its steps.

Each step's forward is timed against what the table priced it at (`_observe`): the
answers' schedulers then price from the table as the steps ran it (scheduling/
observed.py), a seeded answer excepted. And each shared step's whole time and tokens go
to the batch's `DraftGuard` (scheduling/guard.py), which holds every answer's drafts back
in the epochs where steps without them have been committing tokens faster.

A failure belongs to the answer it happened in (its `Outcome` carries the error, the
others go on); only a forward that fails fails every answer in it.

Prompts being read share a budget of rows per step (`prompt_rows`, one chunk's worth):
three long prompts arriving together made steps of three 512-row chunks, a third of a
second on two cores for every answer decoding beside them, and for a short request sent
behind them. Within the budget the prompt with the least left to read goes first (a short
request is read before a long one's next chunk), unless another has waited `PATIENCE`
steps; a prompt held back just does not take a chunk this step (its chunks stay as they
are, so its answer is the same), and the first one chosen always runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specgen.core import clock
from specgen.core.events import StepEvent
from specgen.engine.stepper import Rows, Stepper
from specgen.models.transformer import ForwardOutput, Transformer
from specgen.scheduling.batch import (
    OneForward,
    Part,
    RowCosts,
    SeparateForwards,
    batch_prices,
)
from specgen.scheduling.guard import DraftGuard


@dataclass
class Outcome:
    """One answer's part of a step: its event (None: a prefill chunk that is not the
    last), or what went wrong in it."""

    stepper: Stepper
    event: StepEvent | None = None
    error: Exception | None = None


PATIENCE = 4  # steps a prompt can be held back before it goes first


@dataclass
class Counters:
    """What the steps ran (the server's /metrics)."""

    steps: int = 0
    rows: int = 0  # target rows, every answer's
    answers: int = 0  # answers in each step, summed (/ steps: the mean batch)
    drafted: int = 0  # rows that were drafts
    by_size: dict[int, int] = field(default_factory=dict)  # answers in a step -> steps
    held: int = 0  # shared steps whose answers' drafts the guard held back (`DraftGuard`)


class Batch:
    """Steps several answers together; `costs` says how a shared step is priced."""

    def __init__(self, costs: RowCosts | None = None, prompt_rows: int | None = None) -> None:
        self.costs: RowCosts = costs or SeparateForwards()
        self.prompt_rows = prompt_rows  # prompt rows per step, all answers' (None: no bound)
        self.counters = Counters()
        self._turn = 0
        self._decoding: set[int] = set()
        self._held: dict[int, int] = {}  # id(stepper) -> steps its prompt was held back
        self.guard = DraftGuard()

    @torch.inference_mode()
    def step(self, steppers: Sequence[Stepper]) -> list[Outcome]:
        """One step of every answer in `steppers` (none of them done); outcomes in order."""
        everyone = list(steppers)
        if not everyone:
            return []
        held = self._hold(everyone)
        live = [s for s in everyone if id(s) not in held]
        first = self._turn % len(live)
        self._turn += 1
        order = live[first:] + live[:first]
        parts: dict[int, Part] = {id(s): (s.context, s.rows_now()) for s in live}
        self._decoding = {id(s) for s in live if not s.prefilling}  # get a token this step
        began = clock.now()
        drafting = self.guard.drafting(len(self._decoding))
        outcomes: dict[int, Outcome] = {}
        planned: list[tuple[Stepper, Rows]] = []
        held = False  # whether the guard held back an answer that could have drafted
        for stepper in order:
            stepper.may_draft = drafting or not _guarded(stepper)
            held |= not stepper.may_draft and stepper.drafts
            try:
                self._price(stepper, parts)
                rows = stepper.plan()
            except Exception as e:
                outcomes[id(stepper)] = Outcome(stepper, error=e)
                parts.pop(id(stepper))
                continue
            finally:
                if stepper.scheduler is not None:
                    stepper.scheduler.step_prices = None
            parts[id(stepper)] = (stepper.context, len(rows.tokens))
            planned.append((stepper, rows))
        self._count(planned, held)
        try:
            start = clock.now()
            outs = forward_all([rows for _, rows in planned])
            self._observe(planned, [parts[id(s)] for s, _ in planned], clock.now() - start)
        except Exception as e:  # the forward all of them were in
            for stepper, _ in planned:
                outcomes[id(stepper)] = Outcome(stepper, error=e)
            return [outcomes.get(id(s), Outcome(s)) for s in everyone]
        for (stepper, _), out in zip(planned, outs, strict=True):
            try:
                outcomes[id(stepper)] = Outcome(stepper, stepper.finish(out))
            except Exception as e:
                outcomes[id(stepper)] = Outcome(stepper, error=e)
        self._judge(planned, outcomes, clock.now() - began)
        return [outcomes.get(id(s), Outcome(s)) for s in everyone]  # held back: nothing

    def _judge(
        self, planned: list[tuple[Stepper, Rows]], outcomes: dict[int, Outcome], seconds: float
    ) -> None:
        """This step's time and the tokens its decoding answers committed, to the guard."""
        tokens = sum(
            len(o.event.tokens) for k, o in outcomes.items()
            if k in self._decoding and o.event is not None
        )  # fmt: skip
        reading = any(rows.prefill for _, rows in planned)
        self.guard.ran(len(self._decoding), tokens, seconds, reading)

    def _hold(self, steppers: list[Stepper]) -> set[int]:
        """The prompts held back this step (ids): those past the budget of prompt rows."""
        reading = [s for s in steppers if s.prefilling]
        ids = {id(s) for s in reading}
        self._held = {k: n for k, n in self._held.items() if k in ids}
        if self.prompt_rows is None or len(reading) < 2:
            return set()
        order = [s for _, _, _, s in sorted(
            (self._held.get(id(s), 0) < PATIENCE, s.prompt_left, i, s)
            for i, s in enumerate(reading)
        )]  # fmt: skip
        left, held = self.prompt_rows, set()
        for i, stepper in enumerate(order):
            rows = stepper.rows_now()
            if i == 0 or rows <= left:
                left -= rows
                self._held.pop(id(stepper), None)
            else:
                held.add(id(stepper))
                self._held[id(stepper)] = self._held.get(id(stepper), 0) + 1
        return held

    def _price(self, stepper: Stepper, parts: dict[int, Part]) -> None:
        """Hand `stepper`'s scheduler the prices of this step as planned so far, when it
        will decide a draft by them (a cost policy with a table) and shares the step."""
        scheduler = stepper.scheduler
        if scheduler is None or not scheduler.prices_drafts or not stepper.drafts:
            return
        if stepper.seeded:  # a seeded sample depends on its conversation and seed alone
            return
        others = [part for key, part in parts.items() if key != id(stepper)]
        if not others:
            return  # alone: the table's own prices
        producing = len(self._decoding - {id(stepper)})
        assert scheduler.costs is not None
        scheduler.step_prices = batch_prices(
            scheduler.table(), self.costs, stepper.context, others, producing
        )

    def _observe(
        self, planned: list[tuple[Stepper, Rows]], parts: list[Part], seconds: float
    ) -> None:
        """Keep this step's forward time against the table's price for it, under its rows
        less one (a step with a prefill chunk is not a verify block, nor are answers'
        separate forwards one of all their rows: neither is kept)."""
        if any(rows.prefill for _, rows in planned):
            return
        if len(planned) > 1 and not isinstance(self.costs, OneForward):
            return
        verify = sum(rows for _, rows in parts) - 1
        for stepper, _ in planned:  # one record per pipeline: the first that keeps one
            scheduler = stepper.scheduler
            if scheduler is not None and scheduler.costs is not None and scheduler.ran(
                verify, seconds, self.costs.seconds(scheduler.costs, parts)
            ):
                return

    def _count(self, planned: list[tuple[Stepper, Rows]], held: bool) -> None:
        c = self.counters
        c.steps += 1
        c.held += held
        c.answers += len(planned)
        c.by_size[len(planned)] = c.by_size.get(len(planned), 0) + 1
        for _, rows in planned:
            c.rows += len(rows.tokens)
            if not rows.prefill:
                c.drafted += len(rows.tokens) - 1


def _guarded(stepper: Stepper) -> bool:
    """Whether the guard may hold `stepper`'s drafts back: its scheduler weighs drafts
    against their cost (an explicit full or threshold policy drafts as asked), and it is
    not a seeded sample (which decides as if alone)."""
    scheduler = stepper.scheduler
    return scheduler is not None and scheduler.prices_drafts and not stepper.seeded


def forward_all(planned: Sequence[Rows]) -> list[ForwardOutput]:
    """The target's output for each answer's rows. Answers on one CPU target that the
    fused pass runs share one pass (`Transformer.forward_shared`: the weights read once
    for all their rows, each row's bits its own); the others' rows are a forward of their
    own, which every target, weight format and device runs, with the answer's own bits."""
    outs: list[ForwardOutput | None] = [None] * len(planned)
    shared: dict[int, list[int]] = {}  # id(target) -> the answers that share its pass
    for i, rows in enumerate(planned):
        model = rows.forward
        if isinstance(model, Transformer) and model.shares_pass(rows.cache, len(rows.tokens)):
            shared.setdefault(id(model), []).append(i)
    for group in shared.values():
        if len(group) < 2:
            continue  # alone: its own forward below
        model = planned[group[0]].forward
        taps = tuple(dict.fromkeys(t for i in group for t in planned[i].taps))
        parts = [(planned[i].tokens, planned[i].cache, planned[i].num_logits) for i in group]
        for i, out in zip(group, model.forward_shared(parts, taps), strict=True):
            want = planned[i].taps
            outs[i] = ForwardOutput(out.logits, {t: h for t, h in out.taps.items() if t in want})
    for i, rows in enumerate(planned):
        if outs[i] is None:
            tokens = torch.tensor([rows.tokens], device=rows.device)
            outs[i] = rows.forward(tokens, rows.cache, taps=rows.taps, num_logits=rows.num_logits)
    return outs  # type: ignore[return-value]
