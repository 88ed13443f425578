"""The schedulers a pipeline's answers start with, and what one answer's scheduler learnt
carried to the next (`VerifyScheduler.learn_from`), so a new session does not spend its
first steps relearning the acceptance rates the last one already measured."""

from __future__ import annotations

import weakref

from specgen.core.config import SamplingParams, VerifyPolicy
from specgen.scheduling.cost import CostTable
from specgen.scheduling.observed import ObservedPrices
from specgen.scheduling.scheduler import VerifyScheduler


class Schedulers:
    """Per pipeline: its verify policy, its cost table (None: unmeasured) and how many
    drafters it mounts decide whether answers get a scheduler at all; `learnt` is the last
    finished answer's."""

    def __init__(
        self, policy: VerifyPolicy, costs: CostTable | None, drafters: int, *,
        observe: bool = True,
    ) -> None:  # fmt: skip
        self.policy = policy
        self.costs = costs
        # what a seeded sampling answer decides from: the table as the pipeline got it, not
        # one measured again mid-process (`reprice`: engine/costs.CostWatch, on a busy
        # machine even between two answers of a test), so the same seed gives the same
        # sample for as long as the process runs
        self.seeded_costs = costs
        self.several = drafters > 1
        self.learnt: VerifyScheduler | None = None
        # how this pipeline's forwards ran against its table: for a table measured here
        # (`observe`); prices handed in (tests, what-if runs) are taken as they are
        self.observed = ObservedPrices() if observe else None
        # every scheduler handed out and still alive (idle sessions' too): a new table
        # reaches them all, or answers in one batch would price by two tables and keep
        # their steps' ratios in two records
        self._made: weakref.WeakSet[VerifyScheduler] = weakref.WeakSet()

    def new(self, *, learn: bool = True) -> VerifyScheduler | None:
        """The scheduler a new answer starts with (from what the last one learnt, and
        pricing steps as they have run; unless `learn` is False, a seeded answer's: the
        prior, and the table as first given); None when every draft is verified whole and
        there is no choice of drafter to make, or when the policy or the choice needs costs
        there are none of."""
        costs = self.costs if learn else self.seeded_costs
        if (self.policy.kind == "full" and not self.several) or (costs is None and (
            self.policy.needs_costs or self.several
        )):  # fmt: skip
            return None
        scheduler = VerifyScheduler(self.policy, costs)
        scheduler.keeps_costs = not learn
        self._made.add(scheduler)
        if learn:
            scheduler.observed = self.observed
            if self.learnt is not None:
                scheduler.learn_from(self.learnt)
        return scheduler

    def for_answer(
        self, current: VerifyScheduler | None, params: SamplingParams
    ) -> VerifyScheduler | None:
        """The scheduler an answer on a drafting session runs with: its session's
        (`current`), except that a seeded sampling answer starts from the prior. A seeded
        answer depends on its conversation and seed alone: how many drafts are verified and
        which drafter drafts decide which draws fall on which token, so what earlier
        answers learnt must not enter it."""
        if params.seeded:
            return self.new(learn=False)
        return current

    def finished(self, scheduler: VerifyScheduler | None) -> None:
        """An answer ended (done or cut off) with `scheduler`: later ones start from it."""
        if scheduler is not None:
            self.learnt = scheduler

    def reprice(self, costs: CostTable, *running: VerifyScheduler | None) -> None:
        """Costs measured again: they decide from now on, in new schedulers, the learnt
        one, the `running` ones and every other this pipeline handed out (sessions idle or
        mid-conversation, answers in the same batch); a seeded answer's keep the table as
        first given (`seeded_costs`)."""
        self.costs = costs
        if self.observed is not None:  # ratios to the old table say nothing of the new
            self.observed = ObservedPrices()
        for scheduler in {*running, self.learnt, *self._made} - {None}:
            if not scheduler.keeps_costs:
                scheduler.costs = costs
                if scheduler.observed is not None:
                    scheduler.observed = self.observed
