"""How long OpenMP's idle threads spin before they sleep, chosen per command before torch
loads libgomp (it reads GOMP_SPINCOUNT once, when torch is first imported).

`import specgen` shortens the spin (`DEFAULT`): beside a busy process, threads spinning
for libgomp's 300,000 rounds took the core from the thread they waited for (the eager
layers ran an OpenMP region per op; docs/results.md, "Threads beside a busy process").
`specgen serve` takes libgomp's own length back (`SERVING`): between two of its fused
passes the worker spends a millisecond in Python while the event loop streams the last
token on the other core, so a helper that slept after 3,000 rounds had to be woken onto a
busy core at every pass; one client's tokens/s rose 9-25%, with 4 or 8 clients or
beside a busy process it stayed within noise (docs/results.md, session 64).

Only a choice specgen made is changed: GOMP_SPINCOUNT or OMP_WAIT_POLICY set by the user
stays, and once torch is loaded nothing changes (libgomp has read it). A child process
inherits specgen's choice as its own environment; `MARK` tells it the value was ours.
"""

from __future__ import annotations

import os
import sys

DEFAULT = "3000"  # rounds (about 30 us here)
SERVING = "300000"  # libgomp's own default (about 3 ms)
MARK = "SPECGEN_GOMP_SPINCOUNT"  # the value specgen set, so a later choice may replace it


def _ours() -> bool:
    """Whether the spin in the environment is one specgen chose (or none is chosen)."""
    if "OMP_WAIT_POLICY" in os.environ:
        return False
    spin = os.environ.get("GOMP_SPINCOUNT")
    return spin is None or spin == os.environ.get(MARK)


def choose(spin: str) -> bool:
    """Set OpenMP's spin to `spin` rounds unless the user chose one or libgomp has already
    read it (torch loaded); whether it was set."""
    if not _ours() or "torch" in sys.modules:
        return False
    os.environ["GOMP_SPINCOUNT"] = os.environ[MARK] = spin
    return True


def for_serving() -> bool:
    """The server's spin (`SERVING`), where specgen may still choose it."""
    return choose(SERVING)
