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
)

DEFAULT_POSITIONS = 16  # acceptance positions tracked when no cost table bounds them


class VerifyScheduler:
    """Per-session: the policy, acceptance estimates from finished steps, measured costs."""

    def __init__(self, policy: VerifyPolicy, costs: CostTable | None = None) -> None:
        if policy.needs_costs and costs is None:
            raise ValueError(f"verify policy {policy} needs a cost table")
        self.policy = policy
        self.costs = costs
        self.tracker = AcceptanceTracker(costs.max_drafts if costs else DEFAULT_POSITIONS)

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

    def trim(self, draft: Draft, context: int) -> Draft:
        """The draft cut to the chosen verify length."""
        if draft.length == 0:
            return draft
        return draft.truncated(self.decide(draft, context).length)

    def record(self, draft: Draft, accepted: int) -> None:
        """After verification of `draft` (already trimmed): `accepted` tokens were accepted."""
        self.tracker.record(draft.bucket, draft.length, accepted)
