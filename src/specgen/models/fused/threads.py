"""How many threads the fused CPU pass takes, chosen from its own measured calls.

Two threads beside one busy process are slower than one: the thread that shares a core
with the other process runs at half speed and its partner waits at every barrier (the
embedded default fell from 148 to 35 tokens/s beside one spinning process on 2 cores,
where one thread alone gives about 85). No fixed setting is right on both a quiet and a
busy machine, and the load changes while a server runs. Since the pass computes the same
bits with any thread count, the count can change between any two calls at no cost to
exactness.

Each kind of call (by row count) starts with every thread and now and then *tries* another
count: three calls with it, the first only warming it (a thread woken after a long sleep,
its caches cold, was up to 2.5x slower on its first call), the other two timed against
the chosen count's last calls just before. Only such side-by-side ratios decide, never
times taken minutes apart: a call's time grows with its answers' contexts and moves with
whatever else the machine does, and servers whose first 8-row calls were slowed by
something else for a few seconds (every pass 2.6x slower at two threads) judged one
thread faster, kept it, and ran their batches at 0.8x the speed. Fewer threads must win
two tries in a row, more threads on their median. Tries come more rarely while the choice
holds, and back to back when the chosen count's calls slow down (the load changed).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

# calls of up to this many rows are tuned (decode steps, verify blocks); a prefill takes
# every thread: its phases are long and split evenly, so a slow thread costs what it saves
MAX_TUNED_ROWS = 64
FIRST_PROBE, LAST_PROBE = 16, 512  # calls between tries of another count: doubling
REFERENCE = 7  # the chosen count's last calls a try is set against (their median)
TIMED = 2  # a try's calls timed after its warming one (their median)
TRIES = 2  # a count's last tries that must all beat the chosen one
MARGIN = 0.85  # each halving of the count must be this much faster to be taken
CHANGED = 2.0  # the chosen count's time this much above its last tried: the load changed


def candidates(most: int) -> tuple[int, ...]:
    """`most`, then halvings down to one (16 cores: 16, 8, 4, 2, 1)."""
    out = [most]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return tuple(out)


@dataclass
class _Kind:
    counts: tuple[int, ...]
    chosen: int = 0
    recent: deque = field(default_factory=lambda: deque(maxlen=REFERENCE))  # s per row
    ratios: dict[int, deque] = field(default_factory=dict)  # a count's tries / the chosen's
    base: float = math.inf  # the chosen count's median when a try last began
    calls: int = 0
    interval: int = FIRST_PROBE
    next_probe: int = FIRST_PROBE
    hurry: bool = True  # tries back to back until each count has its full set
    probe: int = 0  # which other count the next try takes
    trying: int = 0  # the count being tried (0: none)
    timed: list = field(default_factory=list)  # the try's calls, s per row

    def __post_init__(self) -> None:
        self.chosen = self.chosen or self.counts[0]

    @property
    def others(self) -> list[int]:
        return [n for n in self.counts if n != self.chosen]

    def wins(self, n: int) -> bool:
        """Whether count `n`'s tries beat the chosen count, fewer threads held to MARGIN
        per halving (and more threads let off as much): on a quiet machine more threads
        win by far, and where they tie with fewer (two busy processes on two cores) noise
        must not hand the calls to one thread. Fewer threads must win every try, more
        threads on the tries' median: the calls go back to the quiet machine's count
        sooner than they leave it."""
        tries = self.ratios.get(n, ())
        if len(tries) < TRIES:
            return False
        halvings = self.counts.index(n) - self.counts.index(self.chosen)
        judged = max(tries) if halvings > 0 else statistics.median(tries)
        return judged < MARGIN**halvings

    def choose(self, n: int) -> None:
        self.chosen, self.base, self.hurry = n, math.inf, False
        self.recent.clear()
        self.ratios.clear()
        self.interval, self.next_probe = FIRST_PROBE, self.calls + FIRST_PROBE

    def changed(self) -> None:
        """The chosen count's calls slowed down: the load changed, earlier tries say
        nothing now, and new ones come at once."""
        self.ratios.clear()
        self.interval, self.hurry = FIRST_PROBE, True
        self.next_probe = min(self.next_probe, self.calls + 1)


class ThreadTuner:
    """`choose` before a call, `record` after it with what `choose` returned."""

    def __init__(self) -> None:
        self.kinds: dict[int, _Kind] = {}

    @staticmethod
    def kind_of(rows: int) -> int:
        return 1 if rows == 1 else 4 if rows <= 4 else 16 if rows <= 16 else 64

    def choose(self, rows: int, most: int) -> int:
        if most <= 1 or rows > MAX_TUNED_ROWS:
            return most
        kind = self.kinds.get(self.kind_of(rows))
        if kind is None or kind.counts[0] != most:  # new, or --threads changed
            kind = self.kinds[self.kind_of(rows)] = _Kind(candidates(most))
        if kind.trying:
            return kind.trying
        kind.calls += 1
        if kind.calls < kind.next_probe or len(kind.recent) < REFERENCE:
            return kind.chosen
        others = kind.others
        kind.probe = (kind.probe + 1) % len(others)
        kind.trying, kind.timed = others[kind.probe], []
        kind.base = statistics.median(kind.recent)
        return kind.trying

    def record(self, rows: int, threads: int, seconds: float) -> None:
        kind = self.kinds.get(self.kind_of(rows))
        if kind is None or rows > MAX_TUNED_ROWS:
            return
        if kind.trying and threads == kind.trying:
            self._tried(kind, threads, seconds / rows)
        elif threads == kind.chosen:
            self._ran(kind, seconds / rows)

    @staticmethod
    def _tried(kind: _Kind, threads: int, per_row: float) -> None:
        kind.timed.append(per_row)  # the first warms the count, untimed
        if len(kind.timed) <= TIMED:
            return
        tries = kind.ratios.setdefault(threads, deque(maxlen=TRIES))
        tries.append(statistics.median(kind.timed[1:]) / statistics.median(kind.recent))
        kind.trying = 0
        if kind.wins(threads):
            kind.choose(threads)
            return
        if kind.hurry and any(len(kind.ratios.get(n, ())) < TRIES for n in kind.others):
            kind.next_probe = kind.calls + 1
            return
        if not kind.hurry and len(tries) == TRIES:  # the choice held: look more rarely
            kind.interval = min(2 * kind.interval, LAST_PROBE)
        kind.hurry = False
        kind.next_probe = kind.calls + kind.interval

    @staticmethod
    def _ran(kind: _Kind, per_row: float) -> None:
        kind.recent.append(per_row)
        if len(kind.recent) < REFERENCE or kind.calls % REFERENCE:
            return  # (windows apart: overlapping ones would see one slow stretch 7 times)
        now = statistics.median(kind.recent)
        if now > CHANGED * kind.base:
            kind.base = now
            kind.changed()
        elif kind.base == math.inf:
            kind.base = now  # the first window: until the first try
