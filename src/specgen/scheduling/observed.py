"""Step prices as this machine runs them: the cost table corrected by the steps that ran.

The table is measured once, in isolation, each block size keeping its fastest run; the
answers' steps then run beside drafting, sampling and whatever else the machine does, and
on the 2-core CPU a 4-row verify block took 1.6 plain steps as the answers ran it against
the table's 1.2 (its plain step was also its slowest run). A scheduler that believes the
table drafts where drafting loses: the default's learned drafters ran at 0.89-0.93x AR on
Spec-Bench while the table modeled 0.98-0.99x. So each verify length's price is scaled by
how long its forwards actually took against what the table said (the median of the last
`WINDOW` such ratios; a length not yet seen takes a ratio on the line between the seen
lengths beside it, the longest seen one's past them, and the table's own below them), and
the decisions follow the machine's own figures.

A step several answers share (engine/batch.py) is timed as one forward of all their rows
against the table's price for it, and kept under its rows less one: the verify length of
one answer's forward of as many rows. Each scheduler then prices from the corrected table
(`corrected`), alone or in a batch.

Only where the decisions cannot change the output: a seeded sampling answer's draws depend
on how many drafts each step verifies, so it keeps the table's prices alone (scheduling/
learning.py hands it none of these).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import replace

from specgen.scheduling.cost import CostTable, rising

WINDOW = 15  # ratios per verify length: the median of the last ones (a busy machine's are
# heavy-tailed, and the load changes)
MIN_SAMPLES = 3  # ratios a verify length needs before its own decides
REFRESH = 4  # a length's median is taken again every this many ratios (it is read each step)
# a median that moved less than this keeps its old value: every change makes the schedulers
# price their options again (80 us on the CPU), and the ratios' own noise is larger (at 1%
# a fifth of a learned drafter's plain steps still priced again)
MOVE = 0.03


class ObservedPrices:
    """Per pipeline: observed / priced seconds of target forwards, by verify length."""

    def __init__(self) -> None:
        self._ratios: dict[int, deque[float]] = {}
        self._medians: dict[int, float] = {}  # lengths with MIN_SAMPLES: their median
        self._counts: dict[int, int] = {}
        self.version = 0  # moves when a median does: schedulers re-price then
        self._table: tuple[tuple[int, int], CostTable] | None = None  # `corrected`'s last
        self._probes: dict[str | None, deque[float]] = {}  # by drafter: probe draft seconds
        self._probe_medians: dict[str | None, float] = {}

    def record(self, verify: int, seconds: float, priced: float) -> None:
        """A forward verifying `verify` drafts took `seconds`; the table priced it `priced`."""
        if seconds <= 0 or priced <= 0:
            return
        seen = self._ratios.setdefault(verify, deque(maxlen=WINDOW))
        seen.append(seconds / priced)
        count = self._counts[verify] = self._counts.get(verify, 0) + 1
        if len(seen) < MIN_SAMPLES or (verify in self._medians and count % REFRESH):
            return
        if _settle(self._medians, verify, seen):
            self.version += 1

    def probed(self, source: str | None, seconds: float) -> None:
        """Drafting a probe with drafter `source` took `seconds`. A probe comes after a
        run of plain steps, so its draft first catches the drafter up on what it skipped
        (a learned drafter projects every token since its last draft): 7.5 ms for the
        default's DFlash drafter against its table's 1.5, so probes paced by the table
        cost two to three times their budget."""
        if seconds <= 0:
            return
        seen = self._probes.setdefault(source, deque(maxlen=WINDOW))
        seen.append(seconds)
        _settle(self._probe_medians, source, seen)  # (`pick` reads it at its next grain)

    def probe_seconds(self, source: str | None) -> float | None:
        """What drafting a probe with `source` has taken (the median of its last ones)."""
        return self._probe_medians.get(source)

    def ratio(self, verify: int) -> float | None:
        """How much dearer than the table this verify length runs (None: nothing seen yet):
        its own median, else on the line between the seen lengths beside it, the longest
        seen one's past them (a longer block is no cheaper for the table's errors), none
        below them."""
        if verify in self._medians:
            return self._medians[verify]
        below = [n for n in self._medians if n < verify]
        above = [n for n in self._medians if n > verify]
        if not below:
            return None
        if not above:
            return self._medians[max(below)]
        a, b = max(below), min(above)
        ra, rb = self._medians[a], self._medians[b]
        return ra + (rb - ra) * (verify - a) / (b - a)

    def corrected(self, table: CostTable) -> CostTable:
        """`table` with each verify length's costs scaled by what its forwards showed."""
        if not self._medians:
            return table
        key = (id(table), self.version)
        if self._table is not None and self._table[0] == key:
            return self._table[1]
        ratios = [self.ratio(n) or 1.0 for n in range(table.max_drafts + 1)]
        seconds = tuple(rising([s * r for s, r in zip(row, ratios, strict=True)])
                        for row in table.seconds)  # fmt: skip
        made = replace(table, seconds=seconds)
        self._table = (key, made)
        return made


def _settle(medians: dict, key, seen: deque[float]) -> bool:
    """`medians[key]` set to the median of `seen` unless that moved it by `MOVE` or less;
    whether it moved."""
    median, known = statistics.median(seen), medians.get(key)
    if known is not None and abs(median - known) <= MOVE * known:
        return False
    medians[key] = median
    return True
