"""The loop's one handle on scheduling: trim a draft before verification, learn after it."""

from __future__ import annotations

from specgen.drafting.base import Draft
from specgen.scheduling.acceptance import AcceptanceTracker
from specgen.scheduling.cost import CostTable
from specgen.scheduling.policy import VerifyPolicy
from specgen.scheduling.verify_length import (
    VerifyDecision,
    choose_verify_length,
    full_length,
    threshold_length,
    worth_drafting,
)

DEFAULT_POSITIONS = 16  # acceptance positions tracked when no cost table bounds them
PROBE_AFTER = (4, 32)  # skipped steps before a probe draft: first, and at most (doubling)
PROBE_LENGTH = 3  # drafts a probe verifies, whatever the estimates say


class VerifyScheduler:
    """Per-session: the policy, acceptance estimates from finished steps, measured costs."""

    def __init__(self, policy: VerifyPolicy, costs: CostTable | None = None) -> None:
        if policy.needs_costs and costs is None:
            raise ValueError(f"verify policy {policy} needs a cost table")
        self.policy = policy
        self.costs = costs
        self.tracker = AcceptanceTracker(costs.max_drafts if costs else DEFAULT_POSITIONS)
        self._skips = 0  # consecutive skipped drafts
        self._probe_after = PROBE_AFTER[0]
        self._probing = False

    def decide(self, draft: Draft, context: int) -> VerifyDecision:
        """How many of `draft`'s tokens to verify. `context`: tokens in the target cache."""
        length = draft.length
        if self.costs is not None:
            length = min(length, self.costs.max_drafts)
        if draft.confidence is not None:  # the drafter's own estimates for these tokens
            conditional = draft.confidence[0, :length].tolist()
        else:  # learned from earlier steps' drafts of the same kind
            conditional = self.tracker.rates(draft.bucket, length)
        if self.policy.kind == "full":
            return full_length(conditional)
        if self.policy.kind == "threshold":
            return threshold_length(conditional, self.policy.threshold)
        assert self.costs is not None
        return choose_verify_length(
            conditional,
            step_seconds=self.costs.step_seconds(context),
            draft_seconds=self.costs.draft_seconds,
        )

    def should_draft(self, bucket: int | None, context: int) -> bool:
        """Before drafting (cost policy, drafters with a `steady_bucket`): whether a draft is
        expected to pay for the drafter's own time. When it is not, the step is a plain
        decoding step (call `skipped`). A skipped step teaches nothing about acceptance, so
        after a run of skips one probe draft is verified anyway (`PROBE_LENGTH` tokens);
        the run before the next probe doubles while probes fail, up to `PROBE_AFTER[1]`."""
        if bucket is None or self.policy.kind != "cost" or self.costs is None:
            return True
        rates = self.tracker.rates(bucket, self.costs.max_drafts)
        worth = worth_drafting(
            rates,
            step_seconds=self.costs.step_seconds(context),
            draft_seconds=self.costs.draft_seconds,
        )
        if worth or self._skips < self._probe_after:
            return worth
        self._probing = True
        return True

    def skipped(self) -> None:
        self._skips += 1
        self.tracker.decay()

    def trim(self, draft: Draft, context: int) -> Draft:
        """The draft cut to the chosen verify length."""
        if draft.length == 0:
            return draft
        if self._probing:
            return draft.truncated(PROBE_LENGTH)
        return draft.truncated(self.decide(draft, context).length)

    def record(self, draft: Draft, accepted: int) -> None:
        """After verification of `draft` (already trimmed): `accepted` tokens were accepted."""
        self.tracker.record(draft.bucket, draft.length, accepted)
        if self._probing:
            failed = accepted == 0
            self._probe_after = (
                min(2 * self._probe_after, PROBE_AFTER[1]) if failed else PROBE_AFTER[0]
            )
            self._probing = False
        self._skips = 0
