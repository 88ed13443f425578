"""The one clock that decoding's timings read: each step's seconds (`stats.GenStats`) and
the measured step costs (`engine/costs.py`) the scheduler decides from.

Read through `clock.now()`, so that a test of a decision that depends on timings (a cost
table judged stale, say) can run on a fake clock and decide the same on a busy machine.
"""

from __future__ import annotations

import time

now = time.perf_counter  # seconds, monotonic; tests replace it (monkeypatch)
