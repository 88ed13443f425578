"""The loops' one handle on scheduling: before a step, whether and with what to draft and
how much (`plan`); after drafting, how much of the draft to verify (`trim`); after
verifying, what was learnt (`record`). Every decision uses finished steps only (and a
drafter's own confidences, slot by slot), so it never biases the output.

Under the cost policy a draft is made only when it is expected to beat a plain decoding
step in tokens per second. Each option (a kind of draft, known before drafting) is priced:
- a drafter without confidences by its per-position acceptance rates: the draft length
  with the best expected rate is settled before drafting, and only that much is drafted;
- a drafter whose confidences trim each draft (DSpark) by its recent steps as they were
  verified, which is honest where the confidences verify long drafts when they are good
  and nothing when they are not (its rates would price every step alike).
Several options (stacked's drafters, under every policy) are compared by the tokens per
second of their own recent steps, and the one drafting last keeps drafting unless another
is expected `SWITCH_MARGIN` faster (the other's estimate is older, so a small edge is mostly
noise). docs/design.md says why, with the replays that chose these rules.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from specgen.core.config import VerifyPolicy
from specgen.core.draft import Draft, DraftOption
from specgen.scheduling.cost import CostTable
from specgen.scheduling.history import StepHistory
from specgen.scheduling.observed import ObservedPrices
from specgen.scheduling.verify_length import (
    VerifyDecision,
    best_draft,
    best_verify_length,
    choose_verify_length,
    threshold_length,
)

DEFAULT_POSITIONS = 16  # acceptance positions tracked when no cost table bounds them
PROBE_AFTER = 4  # plain steps before the first probe draft (then doubling, see `Probes`)
PROBE_LENGTH = 3  # drafts a probe verifies, whatever the estimates say
PROBE_BUDGET = 0.02  # probes that teach nothing new cost at most this share of decoding
SWITCH_MARGIN = 0.05  # another drafter must be expected this much faster to take over
# `pick` prices its options again when what it learnt changes, or the context moves on by
# this many tokens (prices change with it by well under 1% here): pricing every step was
# 80 us of a 3.5 ms CPU step
PRICE_GRAIN = 16


@dataclass
class Probes:
    """Exploration while drafting does not pay. A plain step teaches nothing about
    acceptance, so after a run of them one probe draft of the most promising option is
    verified anyway (`PROBE_LENGTH` tokens). The run before the next probe doubles after a
    probe with nothing accepted and keeps its length after one with drafts accepted that
    still left drafting not worth it, up to `cap`: the run at which a probe's extra cost
    over a plain step is `PROBE_BUDGET` of the steps between probes. It is back to
    `PROBE_AFTER` once drafting pays on merit. One probe at a time (the resident loop
    records a step late)."""

    skips: int = 0  # plain steps since the last drafted one
    after: int = PROBE_AFTER  # plain steps before the next probe
    cap: int = PROBE_AFTER  # the longest `after` grows to (set by `due`)
    pending: bool = False  # the coming draft is a probe (`VerifyScheduler.trim`)
    out: int = 0  # probes verified but not yet recorded

    def due(self, cap: int) -> bool:
        self.cap = cap
        return self.skips >= min(self.after, cap) and not self.out

    def returned(self, accepted: int) -> None:
        if accepted == 0:
            self.after = min(2 * self.after, self.cap)
        self.out -= 1


class VerifyScheduler:
    """Per session: the policy, measured costs, and what earlier steps showed."""

    def __init__(self, policy: VerifyPolicy, costs: CostTable | None = None) -> None:
        if policy.needs_costs and costs is None:
            raise ValueError(f"verify policy {policy} needs a cost table")
        self.policy = policy
        self.costs = costs
        self.history = StepHistory(costs.max_drafts if costs else DEFAULT_POSITIONS)
        self.probes = Probes()
        self._picked: DraftOption | None = None  # `pick`'s choice for the coming draft
        self._planned = 0  # its draft length (options without confidences)
        self._incumbent: int | None = None  # the bucket that drafted the last drafted step
        # the step prices to decide the coming step by, n = 0..max drafts, when the table's
        # alone would be wrong: a step shared with other answers (scheduling/batch.py)
        self.step_prices: list[float] | None = None
        # the pipeline's record of how its forwards ran against the table (None: the table
        # alone decides, as for a seeded sampling answer)
        self.observed: ObservedPrices | None = None
        self.keeps_costs = False  # a seeded answer's: its table is never replaced (learning.py)
        self._learnt = 0  # moves with every recorded step: `pick`'s prices are stale then
        self._priced: tuple[tuple, tuple] | None = None  # `pick`'s last pricing, and its key

    def learn_from(self, earlier: VerifyScheduler) -> None:
        """Start from what an earlier session learnt (its history and how far apart its
        probes had grown), instead of the optimistic prior: a new chat or bench prompt on
        the same drafter and machine then does not pay for exploring again. Earlier answers
        only, so nothing here looks at the tokens it will judge."""
        self.history = copy.deepcopy(earlier.history)
        self.probes.after = earlier.probes.after
        self._learnt += 1

    @property
    def prices_drafts(self) -> bool:
        """Whether this scheduler weighs a draft's expected gain against its cost (the cost
        policy with a cost table), and so may skip drafting (`pick`)."""
        return self.policy.kind == "cost" and self.costs is not None

    def plan(self, options: Sequence[DraftOption], context: int, room: int) -> tuple[int, int]:
        """Before drafting, for a drafter with these options and up to `room` drafts: the
        bucket to draft with, and how many tokens to draft (0: a plain decoding step)."""
        if room <= 0 or not options:
            return 0, room
        if self.prices_drafts:
            bucket = self.pick(options, context)
            if bucket is None:
                self.skipped()
                return 0, 0
            return bucket, self.draft_length(room)
        if len(options) == 1 or self.costs is None:
            return options[0].bucket, room
        steps = self._steps(context)
        prices = [self._price(o, steps)[0] for o in options]
        return options[self._best(options, prices, steps)].bucket, room

    def pick(self, options: Sequence[DraftOption], context: int) -> int | None:
        """Before drafting (`prices_drafts` only): the bucket of the option with the best
        expected tokens per second, or None when none is expected to beat a plain decoding
        step (then call `skipped`), save for a probe (`Probes`)."""
        assert self.costs is not None and options
        steps, prices, lengths, best, probe_cap = self._pricing(options, context)
        option = options[best]
        self._picked, self._planned = option, lengths[best]
        if prices[best] > 1.0 / steps[0]:
            self.probes.after = PROBE_AFTER
            return option.bucket
        if not self.probes.due(probe_cap):
            self._picked = None
            return None
        self.probes.pending = True
        self._planned = PROBE_LENGTH
        return option.bucket

    def _pricing(self, options: Sequence[DraftOption], context: int) -> tuple:
        """`pick`'s step prices, option prices and lengths, best option and the longest
        run of plain steps between its probes, kept while nothing they depend on moves
        (see PRICE_GRAIN)."""
        key = None
        if self.step_prices is None:  # (a batch's prices are new every step)
            # (what the forwards showed, `observed`, is taken up at the next grain: its
            # medians move with the machine's noise, and pricing again at each move was
            # a tenth of a learned drafter's plain steps)
            key = (tuple(options), context // PRICE_GRAIN, self._learnt, id(self.costs))
            if self._priced is not None and self._priced[0] == key:
                return self._priced[1]
        steps = self._steps(context)
        prices, lengths = zip(*(self._price(o, steps) for o in options), strict=True)
        best = self._best(options, list(prices), steps)
        priced = (steps, prices, lengths, best, self._probe_cap(options[best], steps))
        self._priced = None if key is None else (key, priced)
        return priced

    def _probe_cap(self, option: DraftOption, steps: list[float]) -> int:
        """The run of plain steps at which a probe of `option` costs `PROBE_BUDGET` of
        them (its draft and verify block over a plain step's time)."""
        probed = 0 if option.confidences else PROBE_LENGTH  # 0: its longest
        draft = self._cost(option.source)(probed)
        seen = None if self.observed is None else self.observed.probe_seconds(option.source)
        extra = max(draft, seen or 0.0) - steps[0]
        extra += steps[min(PROBE_LENGTH, len(steps) - 1)]
        return max(PROBE_AFTER, math.ceil(extra / (PROBE_BUDGET * steps[0])))

    def price(self, option: DraftOption, context: int) -> float:
        """The expected tokens per second of drafting with `option` now, as `pick` and
        the stacked comparison (before an option has steps of its own) weigh it."""
        assert self.costs is not None
        return self._price(option, self._steps(context))[0]

    def _steps(self, context: int) -> list[float]:
        """Step prices by verify length: `step_prices` when set, else `table()`'s."""
        assert self.costs is not None
        if self.step_prices is not None:
            return self.step_prices
        return self.table().step_seconds(context)

    def table(self) -> CostTable:
        """The cost table as the forwards that ran corrected it (`observed`), or as
        measured (a seeded answer's; or nothing seen yet)."""
        assert self.costs is not None
        return self.costs if self.observed is None else self.observed.corrected(self.costs)

    def timed(self, context: int, verify: int, seconds: float) -> None:
        """A target forward after `context` tokens, verifying `verify` drafts, took
        `seconds` (with its sampling or verification): kept against the table's price."""
        if self.costs is not None and verify <= self.costs.max_drafts:
            self.ran(verify, seconds, self.costs.step_second(context, verify))

    def drafted(self, seconds: float) -> None:
        """The draft `plan` asked for took `seconds` to make: a probe's is kept in the
        pipeline's record (where it keeps one), so probes are paced by what they cost."""
        if self.probes.pending and self.observed is not None and self._picked is not None:
            self.observed.probed(self._picked.source, seconds)

    def ran(self, verify: int, seconds: float, priced: float) -> bool:
        """A forward of 1 + `verify` rows took `seconds` where the table priced it
        `priced`: kept in the pipeline's record. False where there is none to keep it in
        (or the table has no such verify length)."""
        if self.observed is None or self.costs is None or verify > self.costs.max_drafts:
            return False
        self.observed.record(verify, seconds, priced)
        return True

    def _cost(self, source: str | None) -> Callable[[int], float]:
        """A drafter's time to draft k tokens (k <= 0: its longest)."""
        assert self.costs is not None
        return functools.partial(self.costs.draft_cost, drafter=source)

    def _price(self, option: DraftOption, steps: list[float]) -> tuple[float, int]:
        """An option's expected tokens per second, and its draft length (see the module)."""
        assert self.costs is not None
        cost = self._cost(option.source)
        rates = self.history.rates(option.bucket, self.costs.max_drafts)
        if option.confidences:  # it drafts as long as it may; its confidences trim it
            realised = self.history.rate(option.bucket, step_seconds=steps, draft_seconds=cost(0))
            if realised is None:  # too few steps yet
                realised = best_draft(rates, step_seconds=steps, draft_seconds=cost(0))
                return realised.expected_rate, self.costs.max_drafts
            return realised, self.costs.max_drafts
        by_length = [cost(k) for k in range(1, len(steps))]
        plan = best_draft(rates, step_seconds=steps, draft_seconds=by_length)
        return plan.expected_rate, plan.length

    def _best(self, options: Sequence[DraftOption], prices: list[float], steps: list[float]) -> int:
        """The option to draft with: with several, judged by their own recent steps (their
        price until they have a few), the incumbent kept unless clearly beaten."""
        judged = prices
        if len(options) > 1:
            judged = []
            for option, price in zip(options, prices, strict=True):
                cost = self._cost(option.source)
                own = self.history.own_rate(option.bucket, step_seconds=steps, draft_cost=cost)
                judged.append(price if own is None else own)
        best = max(range(len(options)), key=lambda i: (judged[i], -i))
        held = next((i for i, o in enumerate(options) if o.bucket == self._incumbent), None)
        if held is not None and judged[best] < judged[held] * (1 + SWITCH_MARGIN):
            return held
        return best

    def draft_length(self, room: int) -> int:
        """After `pick` chose to draft: how many tokens to draft, at most `room`. A drafter
        whose confidences trim its drafts drafts all of `room` (they arrive with the draft);
        any other drafts only the length `pick` settled (a probe: `PROBE_LENGTH`), which
        `trim` then verifies whole, so no LM-head row is computed for a token that would
        never be verified."""
        if self._picked is None or self._picked.confidences:
            return room
        return min(room, max(1, self._planned))  # (pick drafts: at least one token)

    def skipped(self) -> None:
        """A step decoded without drafting. The estimates are left as they are: fading them
        back to the (optimistic) prior here would re-draft on a timer, an unpaced second
        exploration next to the probes."""
        self.probes.skips += 1

    def decide(
        self, draft: Draft, context: int, confidence: Sequence[float] | None = None
    ) -> VerifyDecision:
        """How many of `draft`'s tokens to verify. `context`: tokens in the target cache.
        `confidence`: estimates to judge by instead of the draft's own confidences, e.g.
        the same drafter's previous ones, already on the host (engine/resident.py)."""
        length = draft.length
        if self.costs is not None:
            length = min(length, self.costs.max_drafts)
        if confidence is None and draft.confidence is not None:
            # sync: the drafter's own estimates for these tokens
            confidence = draft.confidence[0, :length].tolist()
        known = [] if confidence is None else list(confidence[:length])
        # positions without a confidence: learnt from earlier drafts of the same kind
        conditional = known + self.history.rates(draft.bucket, length)[len(known) :]
        if self.policy.kind != "cost":
            threshold = self.policy.threshold if self.policy.kind == "threshold" else 0.0
            return threshold_length(conditional, threshold)
        assert self.costs is not None
        steps = self._steps(context)
        paid = self.costs.draft_cost(draft.length, draft.source)
        if known:  # the drafter's own estimates: decide slot by slot (see verify_length.py)
            return choose_verify_length(conditional, step_seconds=steps, draft_seconds=paid)
        return best_verify_length(conditional, step_seconds=steps, draft_seconds=paid)

    def trim(self, draft: Draft, context: int, confidence: Sequence[float] | None = None) -> Draft:
        """The draft cut to the chosen verify length (`confidence`: see `decide`)."""
        if draft.length == 0:
            return draft
        if self.probes.pending:
            self.probes.pending = False
            self.probes.out += 1
            return replace(draft.truncated(PROBE_LENGTH), probe=True)
        return draft.truncated(self.decide(draft, context, confidence).length)

    def record(self, draft: Draft, accepted: int, proposed: int | None = None) -> None:
        """After verification of `draft` (already trimmed from `proposed` tokens): `accepted`
        tokens were accepted.

        A drafter with confidences is trimmed by them, never by these estimates, which then
        serve only `pick`: whether drafting pays. So for it a drafted position its
        confidences left unverified counts as a miss; otherwise a drafter whose confidences
        keep trimming to nothing would keep looking as good as the prior and keep paying
        for drafts that are never verified. A step that drafted nothing records nothing:
        counting it would fade the estimates and reset the run the probes are paced by."""
        judged = draft.length
        if draft.confidence is not None and proposed is not None:
            judged = max(judged, proposed)
        if judged == 0:  # a plain decoding step (`skipped`): no evidence, and not a probe
            return
        self.history.record(
            draft.bucket,
            proposed=draft.length if proposed is None else proposed,
            verified=draft.length,
            judged=judged,
            accepted=accepted,
        )
        self._incumbent = draft.bucket
        self._learnt += 1
        if draft.probe:
            self.probes.returned(accepted)
        self.probes.skips = 0
