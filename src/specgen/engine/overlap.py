"""The overlap engine: decoding steps run one or two ahead of the caller's host work.

`overlapped(make_events)` runs a decoding loop (the same loops as without it, so the same
tokens and stats) in a thread of its own and hands each step's `StepEvent` over through a
small bounded queue: while that thread runs step N+1, the caller detokenizes, records and
renders step N (torch releases the GIL inside its kernels). The queue holds at most
`depth` finished steps.

Stops are exact: the loop cuts the output at a stop token or `max_new_tokens` before it
hands a step over. When the caller stops early (Ctrl-C, or it abandons the stream),
closing the stream asks the thread to stop, waits for the step in flight and returns; the
caller then rolls the session back to the tokens it consumed (`Session.settle`).

`--engine auto` uses it on CUDA only: on the CPU a second thread's OpenMP kernels run
slower while the caller's thread holds a team of its own, and measured side by side it
gained nothing (docs/results.md).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Callable, Iterator

from specgen.core.events import StepEvent

DEPTH = 2  # finished steps the decoding thread may run ahead of the caller


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

    worker = threading.Thread(target=produce, name="specgen-decode", daemon=True)
    worker.start()
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
        worker.join()
