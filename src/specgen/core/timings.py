"""Where a load's time went, for `--debug`: the phases of loading, each timed as it runs.

`recording()` collects the phases timed inside it (`phase(name)`), from any thread: the
tokenizer loads beside the weights, so phases may overlap and their sum exceed the wall
time, which the report says. Nothing is kept when no one records.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

Phases = list[tuple[str, float]]
_recordings: list[Phases] = []


@contextmanager
def recording() -> Iterator[Phases]:
    phases: Phases = []
    _recordings.append(phases)
    try:
        yield phases
    finally:
        _recordings.remove(phases)


@contextmanager
def phase(name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        if _recordings:
            _recordings[-1].append((name, time.perf_counter() - start))


def report(phases: Phases, total: float) -> str:
    """One line: "loaded in 2.41 s: imports 1.52 s, model resolved 0.01 s, ...". Phases
    that ran beside another (the tokenizer beside the weights) are marked so."""
    parts = [f"{name} {seconds:.2f} s" for name, seconds in phases]
    overlap = " (some side by side)" if sum(s for _, s in phases) > total * 1.01 else ""
    return f"loaded in {total:.2f} s{overlap}: " + ", ".join(parts)
