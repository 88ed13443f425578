"""Step costs as the schedulers see them: how long the target takes to verify n draft
tokens (n = 0..k) after a context of some length, and how long each drafter takes to
propose k tokens (k = 1..its longest draft: a block drafter runs its backbone over the
whole block either way, but computes LM-head rows, and DSpark Markov draws, only for the
tokens it returns). Plain data: engine/costs.py measures and caches them.

Costs depend on the context length too (attention over the cache grows with it, faster
for a multi-token block than for one token), so they are measured after two context
lengths and interpolated linearly in between (extrapolated beyond).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# GenStats.shapes: context, drafter, tokens proposed, verify length, tokens committed
Shape = tuple[int, str | None, int, int, int]


def rising(seconds: Sequence[float]) -> tuple[float, ...]:
    """Prices of forwards over more and more rows, each at least the ones before it: they
    are timings (and medians of a busy machine's ratios to them), whose noise between
    neighbouring lengths exceeds what a row costs, and a longer block priced below a
    shorter one makes drafting more look cheaper than drafting less."""
    return tuple(itertools.accumulate(seconds, max))


@dataclass(frozen=True)
class CostTable:
    contexts: tuple[int, ...]  # increasing context lengths that were measured
    seconds: tuple[tuple[float, ...], ...]  # [c][n]: a forward over n + 1 tokens at contexts[c]
    # per drafter (its method's name): drafting k tokens at [k - 1]; one entry: any k
    drafts: Mapping[str, tuple[float, ...]] = field(default_factory=dict)

    def draft_cost(self, k: int, drafter: str | None = None) -> float:
        """`drafter`'s time to draft k tokens (k <= 0: its longest draft). None names the
        table's only drafter; a table without drafters prices drafts at 0."""
        if drafter is None:
            if len(self.drafts) > 1:
                raise ValueError(f"name the drafter: this table prices {sorted(self.drafts)}")
            by_length = next(iter(self.drafts.values()), (0.0,))
        else:
            by_length = self.drafts[drafter]
        return draft_time(by_length, k)

    @property
    def max_drafts(self) -> int:
        return len(self.seconds[0]) - 1

    def step_seconds(self, context: int) -> list[float]:
        """Costs for n = 0..max_drafts at this context length (linear in the context)."""
        if len(self.contexts) == 1:
            return list(self.seconds[0])
        i, w = self._between(context)
        s0, s1 = self.seconds[i - 1 : i + 1]
        return [max(a + w * (b - a), 1e-9) for a, b in zip(s0, s1, strict=True)]

    def step_second(self, context: int, n: int) -> float:
        """`step_seconds(context)[n]` alone."""
        if len(self.contexts) == 1:
            return self.seconds[0][n]
        i, w = self._between(context)
        a, b = self.seconds[i - 1][n], self.seconds[i][n]
        return max(a + w * (b - a), 1e-9)

    def _between(self, context: int) -> tuple[int, float]:
        """The measured contexts [i - 1, i] the line through `context` runs between, and
        how far along it lies (beyond them: extrapolated)."""
        i = 1
        while i < len(self.contexts) - 1 and context > self.contexts[i]:
            i += 1
        c0, c1 = self.contexts[i - 1 : i + 1]
        return i, (context - c0) / (c1 - c0)


def draft_time(by_length: Sequence[float], k: int) -> float:
    """A drafter's time to draft k tokens from its times per length ([k - 1]; k <= 0 or
    beyond what was measured: the longest)."""
    if k <= 0:
        return by_length[-1]
    return by_length[min(k, len(by_length)) - 1]


def modeled(shapes: Sequence[Shape], prices: CostTable) -> tuple[int, float] | None:
    """(tokens committed, modeled seconds) over these steps; None when a step cannot be
    priced (a drafter without a measured time, or a verify longer than the table)."""
    tokens, seconds = 0, 0.0
    for context, drafter, proposed, verify, committed in shapes:
        row = prices.step_seconds(context)
        if verify >= len(row):
            return None
        seconds += row[verify]
        if drafter is not None:
            if drafter not in prices.drafts:
                return None
            seconds += prices.draft_cost(proposed, drafter)
        tokens += committed
    return tokens, seconds
