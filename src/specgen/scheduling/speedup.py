"""The speedup over AR that the views show (the live panel, the server's per-answer stats):
modeled from the measured step costs, never measured against a clock. Here, below every
view, so the server need not import the Rich one to show the same number."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from specgen.core.stats import GenStats
from specgen.scheduling.cost import CostTable, Shape, modeled


class ModeledSpeedup:
    """The speedup over AR of an answer's decoding steps, priced from one cost table (as
    `specgen bench`'s modeled column prices them, `scheduling.cost.modeled`):

        speedup = AR's time for the tokens the steps committed / the steps' own time

    both from `costs`. The steps: every decoding step after the prefill (`GenStats.shapes`),
    each at its drafter's time to draft what it proposed + the target's forward over
    1 + its verify length tokens at its context length. AR: one forward over 1 token per
    committed token, at the context length each would have had. One table on both sides,
    so a table measured on a busy machine (every price k times too high) gives the same
    ratio; the wall clock does not enter it. Running sums: `update` prices only the steps
    added since the last call (the live view re-prices 4 times a second)."""

    def __init__(self, costs: CostTable) -> None:
        self.costs = costs
        self.lock = threading.Lock()  # Rich's refresh thread and the printing thread
        self._reset(None)

    def _reset(self, shapes: Sequence[Shape] | None) -> None:
        self.shapes = shapes  # the list priced so far (a new answer's list starts afresh)
        self.priced = 0  # its steps priced so far
        self.ar_seconds = 0.0  # AR's modeled time for the tokens they committed
        self.seconds = 0.0  # their modeled time
        self.unpriceable = False  # a step the table cannot price (an unmeasured drafter)

    def update(self, shapes: Sequence[Shape]) -> float | None:
        """The speedup over these steps; None without steps or when one cannot be priced."""
        with self.lock:
            if shapes is not self.shapes or len(shapes) < self.priced:
                self._reset(shapes)
            new = list(shapes[self.priced :])  # the stepping thread may be appending
            priced = modeled(new, self.costs)
            if priced is None:
                self.unpriceable = True
            elif not self.unpriceable:
                self.seconds += priced[1]
                self.ar_seconds += sum(ar_seconds(self.costs, s[0], s[4]) for s in new)
            self.priced += len(new)
            if self.unpriceable or self.priced == 0 or self.seconds <= 0:
                return None
            return self.ar_seconds / self.seconds


def ar_seconds(costs: CostTable, context: int, tokens: int) -> float:
    """AR's modeled time to commit `tokens` tokens after `context`: one forward over one
    token each, at context, context + 1, ..."""
    return sum(costs.step_seconds(context + i)[0] for i in range(tokens))


def modeled_speedup(stats: GenStats, costs: CostTable | None) -> float | None:
    """The speedup over AR of this answer's decoding steps, priced from `costs`
    (`ModeledSpeedup`); None without a table (AR, `full` verification of one drafter),
    before the first decoding step, or when a step cannot be priced. What every view shows
    (the live panel, `specgen.terminal.live`, and the server's stats)."""
    if costs is None:
        return None
    return ModeledSpeedup(costs).update(stats.shapes)
