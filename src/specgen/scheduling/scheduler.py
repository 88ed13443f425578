"""The loop's one handle on scheduling: trim a draft before verification, learn after it."""

from __future__ import annotations

from specgen.drafting.base import Draft
from specgen.scheduling.acceptance import AcceptanceTracker
from specgen.scheduling.cost import CostTable
from specgen.scheduling.verify_length import choose_verify_length


class VerifyScheduler:
    """Per-session: acceptance estimates from finished steps + the measured cost table."""

    def __init__(self, costs: CostTable) -> None:
        self.costs = costs
        self.tracker = AcceptanceTracker(max_positions=costs.max_drafts)

    def trim(self, draft: Draft, context: int) -> Draft:
        """The draft cut to the verify length with the best expected tokens per second.

        `context` is the number of tokens already in the target cache (costs grow with it).
        """
        if draft.length == 0:
            return draft
        length = min(draft.length, self.costs.max_drafts)
        if draft.confidence is not None:  # the drafter's own survival estimates
            survival = draft.confidence[0, :length].tolist()
        else:
            survival = self.tracker.survival(draft.bucket, length)
        costs = self.costs.step_seconds(context)
        decision = choose_verify_length(survival, step_seconds=costs)
        return draft.truncated(decision.length)

    def record(self, draft: Draft, accepted: int) -> None:
        """After verification of `draft` (already trimmed): `accepted` tokens were accepted."""
        self.tracker.record(draft.bucket, draft.length, accepted)
