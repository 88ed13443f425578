"""Answers before the pipelines are in: the server's first second.

A full load imports torch (about a second on two cores) and builds the engine, though the
embedded default's greedy answers run in C. So when the fast start's image is there
(api/quick.py), `serve` answers at once: while the worker thread loads the pipelines, this
thread answers the queued requests the image can (`answerable`: AR, plain greedy, no
echo or schema), one at a time, with the image's pipeline: the same bytes and
per-row arithmetic, so the same tokens the engine would give (tests/test_serve_early.py).
Every other request waits in the queue for the engine, which takes every job once it is
loaded; an answer begun here finishes here.

It belongs to the worker (serve/worker.py): the queue, the end events and the counters
are the worker's (`Host` names what it uses of them), so every job still ends with exactly
one end event.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from specgen.api.quick import plain_greedy
from specgen.core.config import AR
from specgen.serve.answer import Answering
from specgen.serve.job import CLIENT_GONE, SHUTDOWN, Done, Failed, Job, client_gone, stopping
from specgen.serve.logprobs import Pending


class Host(Protocol):
    """What `Early` uses of its worker (serve/worker.Worker)."""

    _closing: threading.Event  # the server is leaving
    _loaded: threading.Event  # the pipelines are in: no job is taken here any more

    def _take(self, answerable: Callable[[Job], bool]) -> Job | None: ...
    def _guarded(self, job: Job, run: Callable[[], None]) -> None: ...
    def _cancelled(self, job: Job) -> bool: ...
    def _end(self, job: Job, event: Done | Failed) -> None: ...
    def _post(self, job: Job, event: Any) -> None: ...
    def _ended(self, job: Job, answering: Answering, *, error: Exception | None,
               cut_by: str | None, slot: int | None) -> None: ...  # fmt: skip


def answerable(job: Job) -> bool:
    """Whether the image's greedy AR answer is this job's answer."""
    return (
        job.method == AR
        and plain_greedy(job.sampling)
        and not job.echo
        and job.constraint is None
        and job.max_tokens > 0
    )


class Early:
    """The thread that answers from `pipe` until the worker's pipelines are loaded."""

    def __init__(self, worker: Host, pipe: Any, methods: Sequence[str]) -> None:
        self.worker, self.pipe, self.methods = worker, pipe, tuple(methods)
        self.wake = threading.Event()  # a job was queued
        self.running = 0  # answers in progress here (0 or 1)
        self._thread = threading.Thread(target=self._main, name="specgen-early", daemon=True)

    def start(self) -> dict[str, Any]:
        """The pipelines the routes see until the load ends: the image's for every method
        served (requests for the others are checked against it and wait)."""
        self._thread.start()
        return dict.fromkeys(self.methods, self.pipe)

    def _main(self) -> None:
        worker = self.worker
        while not worker._closing.is_set() and not worker._loaded.is_set():
            job = worker._take(answerable)
            if job is None:
                self.wake.wait(0.1)
                self.wake.clear()
                continue
            self.running += 1
            try:
                worker._guarded(job, lambda job=job: self._answer(job))
            finally:
                self.running -= 1

    def _answer(self, job: Job) -> None:
        worker = self.worker
        if worker._cancelled(job):  # its client left while it waited, or the server stops
            worker._end(job, Failed(client_gone() if job.cancel.is_set() else stopping()))
            return
        answering = Answering(job, self.pipe, worker._post, names=None, pending=Pending())
        chunks = self.pipe.stream_ids(
            job.prompt_ids, sampling=job.sampling, max_new_tokens=job.max_tokens,
            ignore_eos=job.ignore_eos,
        )  # fmt: skip
        cut_by = None
        try:
            for chunk in chunks:
                if answering.push(chunk):
                    break
                if worker._cancelled(job):
                    cut_by = CLIENT_GONE if job.cancel.is_set() else SHUTDOWN
                    break
        finally:
            chunks.close()  # the image's cache keeps the answer's prefix
        worker._ended(job, answering, error=None, cut_by=cut_by, slot=None)
