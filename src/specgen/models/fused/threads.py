"""How many threads the fused CPU pass takes, chosen from its own measured calls.

Two threads beside one busy process are slower than one: the thread that shares a core
with the other process runs at half speed and its partner waits at every barrier (the
embedded default fell from 148 to 35 tokens/s beside one spinning process on 2 cores,
where one thread alone gives about 85). No fixed setting is right on both a quiet and a
busy machine, and the load changes while a server runs. Since the pass computes the same
bits with any thread count, the count can change between any two calls at no cost to
exactness: each kind of call (by row count) times its calls per candidate count, takes the
fastest (fewer threads only when clearly faster), and now and then tries another again,
more rarely while the choice holds.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

# calls of up to this many rows are tuned (decode steps, verify blocks); a prefill takes
# every thread: its phases are long and split evenly, so a slow thread costs what it saves
MAX_TUNED_ROWS = 64
FIRST_PROBE, LAST_PROBE = 16, 512  # calls between tries of another count: doubling
WINDOW = 9  # a count's time: the median of its last calls (a busy machine's are heavy-tailed)
WARM = 3  # each count's first calls, the first unmeasured (it warms the caches)
MARGIN = 0.85  # each halving of the count must be this much faster to be taken
CHANGED = 2.0  # the chosen count's time this much above its lowest: the load changed


def candidates(most: int) -> tuple[int, ...]:
    """`most`, then halvings down to one (16 cores: 16, 8, 4, 2, 1)."""
    out = [most]
    while out[-1] > 1:
        out.append(out[-1] // 2)
    return tuple(out)


@dataclass
class _Kind:
    counts: tuple[int, ...]
    times: dict[int, deque] = field(default_factory=dict)  # seconds per row, last calls
    seen: dict[int, int] = field(default_factory=dict)
    chosen: int = 0
    low: float = 0.0  # the chosen count's lowest time since it was chosen
    calls: int = 0
    interval: int = FIRST_PROBE
    next_probe: int = FIRST_PROBE
    probe: int = 0  # which other count the next try takes

    def time(self, n: int) -> float:
        return statistics.median(self.times[n])

    def best(self) -> int:
        """The fastest count, fewer threads held to MARGIN per halving: on a quiet machine
        more threads win by far, and where they tie with fewer (two busy processes on two
        cores) noise must not hand the calls to one thread."""
        known = [n for n in self.counts if n in self.times]
        return min(known, key=lambda n: self.time(n) / MARGIN ** self.counts.index(n))

    def choose(self, n: int) -> None:
        self.chosen, self.low = n, self.time(n)
        self.interval, self.next_probe = FIRST_PROBE, self.calls + FIRST_PROBE


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
        for n in kind.counts:
            if kind.seen.get(n, 0) < WARM:
                return n
        if not kind.chosen:
            kind.choose(kind.best())
        kind.calls += 1
        if kind.calls < kind.next_probe:
            return kind.chosen
        others = [n for n in kind.counts if n != kind.chosen]
        kind.probe = (kind.probe + 1) % len(others)
        kind.next_probe = kind.calls + kind.interval
        return others[kind.probe]

    def record(self, rows: int, threads: int, seconds: float) -> None:
        kind = self.kinds.get(self.kind_of(rows))
        if kind is None or threads not in kind.counts or rows > MAX_TUNED_ROWS:
            return
        seen = kind.seen[threads] = kind.seen.get(threads, 0) + 1
        if seen == 1:
            return  # the warm-up call
        kind.times.setdefault(threads, deque(maxlen=WINDOW)).append(seconds / rows)
        if not kind.chosen:
            return
        best = kind.best()
        if best != kind.chosen:
            kind.choose(best)  # a try found a faster count, or the chosen one slowed down
        elif threads != kind.chosen:  # a try that left the choice as it was: try more
            if len(kind.times[threads]) == WINDOW:  # rarely once its time is its own again
                kind.interval = min(2 * kind.interval, LAST_PROBE)
            kind.next_probe = kind.calls + kind.interval
        else:
            now = kind.time(threads)
            kind.low = min(kind.low, now)
            if now > CHANGED * kind.low:  # the machine changed: look around again soon
                kind.low, kind.interval = now, FIRST_PROBE
                kind.next_probe = min(kind.next_probe, kind.calls + 1)
