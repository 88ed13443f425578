"""The loop's one handle on scheduling: trim a draft before verification, learn after it."""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Sequence
from dataclasses import replace

from specgen.drafting.base import Draft, DraftOption
from specgen.scheduling.acceptance import AcceptanceTracker, OwnSteps, RealisedSteps
from specgen.scheduling.cost import CostTable, draft_time
from specgen.scheduling.policy import VerifyPolicy
from specgen.scheduling.verify_length import (
    VerifyDecision,
    best_draft,
    best_verify_length,
    choose_verify_length,
    drafting_rate,
    full_length,
    threshold_length,
)

DEFAULT_POSITIONS = 16  # acceptance positions tracked when no cost table bounds them
PROBE_AFTER = 4  # skipped steps before the first probe draft (then doubling, see `pick`)
PROBE_LENGTH = 3  # drafts a probe verifies, whatever the estimates say
PROBE_BUDGET = 0.02  # probes that teach nothing new cost at most this share of decoding
SWITCH_MARGIN = 0.05  # another drafter must be expected this much faster to take over
# (benchmarks/results/cpu-replay-stacked-selectors.txt: 0 and 0.1 did worse)


class VerifyScheduler:
    """Per-session: the policy, acceptance estimates from finished steps, measured costs."""

    def __init__(self, policy: VerifyPolicy, costs: CostTable | None = None) -> None:
        if policy.needs_costs and costs is None:
            raise ValueError(f"verify policy {policy} needs a cost table")
        self.policy = policy
        self.costs = costs
        self.tracker = AcceptanceTracker(costs.max_drafts if costs else DEFAULT_POSITIONS)
        # confidence-trimmed drafters: their steps as verified (see RealisedSteps)
        self.realised = RealisedSteps(costs.max_drafts if costs else DEFAULT_POSITIONS)
        # several drafters (stacked): each one's own recent steps, to compare them by
        self.own = OwnSteps(costs.max_drafts if costs else DEFAULT_POSITIONS)
        self._skips = 0  # consecutive skipped drafts
        self._probe_after = PROBE_AFTER
        self._probe_next = False  # `pick` chose a probe: `trim` makes the next draft one
        self._probe_cap = PROBE_AFTER  # the longest run between probes (set by `pick`)
        self._probes_out = 0  # probes trimmed but not yet recorded (the resident loop lags)
        self._options: dict[int, DraftOption] = {}  # per bucket, as `pick` last saw them
        self._picked: DraftOption | None = None  # `pick`'s choice for the coming draft
        self._planned = 0  # its draft length (options without confidences)
        self._incumbent: int | None = None  # the bucket that drafted the last drafted step

    def learn_from(self, earlier: VerifyScheduler) -> None:
        """Start from what an earlier session learnt (its acceptance estimates and how far
        apart its probes had grown), instead of the optimistic prior: a new chat or bench
        prompt on the same drafter and machine then does not pay for exploring again.
        Earlier answers only, so nothing here looks at the tokens it will judge."""
        self.tracker = copy.deepcopy(earlier.tracker)
        self.realised = copy.deepcopy(earlier.realised)
        self.own = copy.deepcopy(earlier.own)
        self._probe_after = earlier._probe_after

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
        # positions without a confidence: learned from earlier drafts of the same kind
        conditional = known + self.tracker.rates(draft.bucket, length)[len(known) :]
        if self.policy.kind == "full":
            return full_length(conditional)
        if self.policy.kind == "threshold":
            return threshold_length(conditional, self.policy.threshold)
        assert self.costs is not None
        steps = self.costs.step_seconds(context)
        paid = self._draft_cost(draft.bucket, draft.length)
        if known:  # the drafter's own estimates: decide slot by slot (see verify_length.py)
            return choose_verify_length(conditional, step_seconds=steps, draft_seconds=paid)
        return best_verify_length(conditional, step_seconds=steps, draft_seconds=paid)

    def _draft_cost(self, bucket: int, k: int) -> float:
        """A draft of k tokens of this bucket (k <= 0: its longest)."""
        assert self.costs is not None
        option = self._options.get(bucket)
        if option is None or option.seconds is None:
            return self.costs.draft_cost(k)
        return draft_time(option.seconds, option.by_length, k)

    @property
    def prices_drafts(self) -> bool:
        """Whether this scheduler weighs a draft's expected gain against its cost (the cost
        policy with a cost table), and so may pick drafters or skip drafting (`pick`)."""
        return self.policy.kind == "cost" and self.costs is not None

    def pick(self, options: Sequence[DraftOption], context: int) -> int | None:
        """Before drafting (`prices_drafts` only): the bucket of the option with the best
        expected tokens per second, or None when no option is expected to beat a plain
        decoding step (then call `skipped`). A drafter whose confidences trim its drafts is
        priced by its recent steps as verified (`RealisedSteps`), any other by its
        per-position rates. Estimates come from earlier steps only, so whether and with
        what to draft never depends on the tokens being judged. With several options
        (stacked), they are compared by the tokens per second of their own last steps
        (`OwnSteps`; by their price until they have a few), and the one that drafted last
        keeps drafting unless another is expected `SWITCH_MARGIN` faster: the other's
        estimate is older, so a small edge is mostly noise. Whether to draft at all is
        then the chosen drafter's price's call.

        A skipped step teaches nothing about acceptance, so after a run of skips one probe
        draft of the most promising option is verified anyway (`PROBE_LENGTH` tokens). The
        run before the next probe doubles after a probe with nothing accepted and keeps its
        length after one with drafts accepted that still left drafting not worth it (near
        the break-even point probes are worth their cost; far below it they are not), up to
        the run at which a probe's extra cost over a plain step is `PROBE_BUDGET` of the
        steps between probes; it is back to `PROBE_AFTER` once the estimates say drafting
        pays. On a CPU where a probe costs 0.9 of a decoding step that is one probe per ~45
        plain steps; where verifying is nearly free (a GPU), one per few."""
        assert self.costs is not None and options
        steps = self.costs.step_seconds(context)
        rates, lengths = [], []
        for option in options:
            self._options[option.bucket] = option
            full = self._draft_cost(option.bucket, 0)  # a confidence-trimmed draft is whole
            rate = self.realised.rate(option.bucket, step_seconds=steps, draft_seconds=full)
            conditional = self.tracker.rates(option.bucket, self.costs.max_drafts)
            if option.confidences:
                length = self.costs.max_drafts
                if rate is None:  # too few steps yet
                    rate = drafting_rate(conditional, step_seconds=steps, draft_seconds=full)
            else:  # the length is settled here, and only that much is drafted
                by_length = [self._draft_cost(option.bucket, k) for k in range(1, len(steps))]
                plan = best_draft(conditional, step_seconds=steps, draft_seconds=by_length)
                length, rate = plan.length, plan.expected_rate
            rates.append(rate)
            lengths.append(length)
        judged = rates if len(options) == 1 else self._judged(options, rates, steps)
        best = max(range(len(options)), key=lambda i: (judged[i], -i))
        held = next((i for i, o in enumerate(options) if o.bucket == self._incumbent), None)
        if held is not None and judged[best] < judged[held] * (1 + SWITCH_MARGIN):
            best = held
        self._picked, self._planned = options[best], lengths[best]
        if rates[best] > 1.0 / steps[0]:
            self._probe_after = PROBE_AFTER
            return options[best].bucket
        probed = 0 if options[best].confidences else PROBE_LENGTH  # 0: its longest
        probe_extra = self._draft_cost(options[best].bucket, probed) - steps[0]
        probe_extra += steps[min(PROBE_LENGTH, len(steps) - 1)]
        self._probe_cap = max(PROBE_AFTER, math.ceil(probe_extra / (PROBE_BUDGET * steps[0])))
        if self._skips < min(self._probe_after, self._probe_cap) or self._probes_out:
            self._picked = None
            return None  # (one probe at a time: the resident loop records a step late)
        self._probe_next = True
        self._planned = PROBE_LENGTH
        return options[best].bucket

    def _judged(
        self, options: Sequence[DraftOption], rates: list[float], steps: list[float]
    ) -> list[float]:
        """Several drafters: each one's rate by its own last steps (`OwnSteps`), or by its
        price until it has enough of them."""
        judged = []
        for option, rate in zip(options, rates, strict=True):
            paid = functools.partial(self._draft_cost, option.bucket)
            own = self.own.rate(option.bucket, step_seconds=steps, draft_seconds=paid)
            judged.append(rate if own is None else own)
        return judged

    def draft_length(self, room: int) -> int:
        """After `pick` chose to draft: how many tokens to draft, at most `room`. A drafter
        whose confidences trim its drafts drafts all of `room` (they arrive with the draft);
        any other drafts only the length `pick` settled from earlier steps (a probe:
        `PROBE_LENGTH`), which `trim` then verifies whole, so no LM-head row is computed for
        a token that would never be verified (on the CPU the default DFlash drafter's step
        costs 3.2 ms for 1 token, 6.3 ms for 7)."""
        if self._picked is None or self._picked.confidences:
            return room
        return min(room, max(1, self._planned))  # (pick drafts: at least one token)

    def skipped(self) -> None:
        """A step decoded without drafting. The estimates are left as they are: letting them
        fade back to the (optimistic) prior here would make the scheduler draft again after
        every few dozen skips, a second, unpaced exploration next to the probes (on the CPU
        it cost DFlash about 5% of its speed on text where drafting never pays)."""
        self._skips += 1

    def trim(self, draft: Draft, context: int, confidence: Sequence[float] | None = None) -> Draft:
        """The draft cut to the chosen verify length (`confidence`: see `decide`)."""
        if draft.length == 0:
            return draft
        if self._probe_next:
            self._probe_next = False
            self._probes_out += 1
            return replace(draft.truncated(PROBE_LENGTH), probe=True)
        return draft.truncated(self.decide(draft, context, confidence).length)

    def record(self, draft: Draft, accepted: int, proposed: int | None = None) -> None:
        """After verification of `draft` (already trimmed from `proposed` tokens): `accepted`
        tokens were accepted.

        A drafter with confidences is trimmed by them, never by these estimates, which then
        serve only `pick`: whether drafting pays. So for it the estimates are of what a draft
        realised, and a drafted position its confidences left unverified counts as a miss;
        otherwise a drafter whose confidences keep trimming to nothing would keep looking as
        good as the prior and keep paying for drafts that are never verified.

        A step that drafted nothing records nothing: counting it would fade the estimates
        (and so re-draft on a timer) and reset the run of skips the probes are paced by."""
        verified = draft.length
        if draft.confidence is not None and proposed is not None:
            verified = max(verified, proposed)
        if verified == 0:  # a plain decoding step (`skipped`): no evidence, and not a probe
            return
        self.tracker.record(draft.bucket, verified, accepted)
        drafted = draft.length if proposed is None else proposed
        self.own.record(draft.bucket, drafted, draft.length, accepted + 1)
        self._incumbent = draft.bucket
        self.realised.fade()  # whichever drafter drafted: a stacked drafter's evidence ages
        if draft.confidence is not None and proposed is not None:  # probes too: they
            self.realised.record(draft.bucket, draft.length, accepted + 1)  # are its steps
        if draft.probe:  # paced as `pick` says
            if accepted == 0:
                self._probe_after = min(2 * self._probe_after, self._probe_cap)
            self._probes_out -= 1
        self._skips = 0
