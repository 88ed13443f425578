"""The overlap engine: decoding steps run one or two ahead of the caller's host work.

`overlapped(make_events)` runs a decoding loop (`engine/loop.py`, `engine/ar.py`, or on
CUDA `engine/resident.py`: the same loops as without it, so the same tokens and stats) in
a compute thread and hands each step's
`StepEvent` to the caller through a small bounded queue. While the compute thread runs
step N+1, the caller's thread detokenizes, updates stats and renders step N; torch
releases the GIL inside its kernels, so the two really run at once. The queue holds at
most `depth` finished steps, so the compute thread is never more than that far ahead.

Stops are exact: the loop itself cuts the output at EOS or `max_new_tokens` before it
hands a step over, so nothing is found "late". When the caller stops early (Ctrl-C, or it
abandons the stream), `close()` asks the compute thread to stop, waits for the step in
flight to finish, and returns; the caller then rolls the session back to the tokens it
actually consumed (`Session.settle`), so the target and drafter caches hold exactly the
answer the user saw and a chat can continue.

The compute thread is `engine/compute.py`'s when the caller has offloaded its torch work
there (the CLI does on the CPU), else a fresh thread per stream. On the CPU that matters:
a second thread's OpenMP kernels run ~1.5x slower while the first thread holds a team of
its own (the overlap engine measured 0.62x of the sync loop that way), so `--engine auto`
overlaps on CUDA, and on the CPU only when offloaded (benchmarks/overlap_vs_sync.py).

Host syncs (each marked `# sync:` where it is):
- engine/ar.py: the sampled token, which the host needs to stop, detokenize and stream. On
  CUDA the next token's forward is queued before it (lookahead), so the device is busy
  while the host waits, checks and hands the token over.
- engine/loop.py (the sync engine, the CPU, and the n-gram drafter, which drafts from
  the committed tokens themselves): the first token after the prefill; the drafted
  tokens (for stats, the trace and the committed run), read only after the verify
  forward is queued on a block built on the device from the device-resident anchor; the
  accepted count and the bonus, which decide the rollback, what the drafter observes and
  the next anchor; and a DSpark
  draft's confidences, which the verify-length rule reads on the host.
- engine/resident.py (the speculative loop on CUDA, for DFlash, DSpark and stacked): the
  first token after the prefill, and per step the event of the step before: the committed
  length, the anchor and the accept count stay on the device, so step N+1 is queued before
  step N's results reach the host.
All of them run in the compute thread here, off the caller's path. The target's decode and
verify steps and the greedy DFlash and DSpark draft steps replay as CUDA graphs
(engine/cuda_graphs.py, drafting/static_draft.py).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator

from specgen.engine import compute
from specgen.engine.events import StepEvent

DEPTH = 2  # finished steps the compute thread may run ahead of the caller


def overlapped(
    make_events: Callable[[], Iterator[StepEvent]], depth: int = DEPTH
) -> Iterator[StepEvent]:
    """The events of `make_events()`, computed in a thread, in order."""
    handoff: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                handoff.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            with contextlib.closing(make_events()) as events:
                for event in events:
                    if not put(("event", event)):
                        return  # the caller stopped: leave after the step in flight
            put(("done", None))
        except BaseException as e:  # handed to the caller, raised there
            put(("error", e))

    join = compute.spawn(produce, name="specgen-decode")
    try:
        while True:
            kind, item = handoff.get()
            if kind == "event":
                yield item
            elif kind == "error":
                raise item
            else:
                return
    finally:
        stop.set()
        join()
