"""The one thread that owns the model: it loads the pipelines, then answers up to
`parallel` requests at once in slots, their steps batched (api/streams.py), taking new
ones from a bounded queue in the order they came.

One thread for all torch work (loading included) because the model, its KV caches and
the sessions that reuse cached prefixes are not thread-safe, and because on the CPU torch
runs slower from a thread other than the one whose OpenMP team it formed (docs/results.md).
The event loop only queues jobs and reads their events.

The loop: fill the free slots from the queue (a request joins at the next step), end the
answers whose client left or that the server is cutting, then one step of every answer in
a slot: a prefill chunk of a prompt being read (so a long prompt never stalls the others
for longer than a chunk), a decoding or speculative step of the others. An answer that
ends frees its slot at once.

A job's events (`Delta`s, then exactly one end: `Done` or `Failed`) go to a callback that
must be safe to call from this thread (the server hands them to the event loop). Every
job that leaves the queue ends with one end event, whatever ended it: answered, its client
gone while it waited or before its prompt was read (`Failed` 499), cut by the server
stopping before it produced anything (`Failed` 503) or after (`Done` with `cut`), or a bug
(`Failed` 500, for the answers it happened in); a handler waiting for it never waits
forever. An answer that ends settles its session, so the next finds a consistent cache.
"""

from __future__ import annotations

import math
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from specgen.core.errors import Cancelled, SpecgenError
from specgen.core.stats import GenStats
from specgen.serve import report
from specgen.serve.answer import Answering
from specgen.serve.early import Early
from specgen.serve.errors import APIError
from specgen.serve.job import (
    CLIENT_GONE,
    SHUTDOWN,
    Delta,
    Done,
    Failed,
    Job,
    Overloaded,
    client_gone,
    stopping,
)
from specgen.serve.log import Log
from specgen.serve.logprobs import Pending, TokenNames, echoed
from specgen.serve.metrics import Metrics

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.api.streams import Stream


# what the worker steps the answers with, from the pipelines and the slots: Streams
# (answers stepped together), OneAtATime (--parallel 1: each pipeline's own engine alone)
StreamsFactory = Callable[[Mapping[str, Any], int], Any]


def streams_for(pipes: Mapping[str, Any], parallel: int) -> Any:
    from specgen.api.one_at_a_time import OneAtATime  # torch: loaded with the pipelines
    from specgen.api.streams import Streams

    return OneAtATime(pipes) if parallel == 1 else Streams(pipes, parallel)


class Worker:
    def __init__(
        self,
        load: Callable[[], dict[str, Pipeline]],
        *,
        queue_size: int,
        parallel: int = 1,
        debug: bool = False,
        log: Log | None = None,
        streams: StreamsFactory = streams_for,
        early: Any = None,
        methods: Sequence[str] = (),
    ) -> None:
        """`early` (api/quick.QuickPipeline): answers plain greedy AR requests from the
        start while `load` runs (serve/early.py); the pipelines then serve `methods`."""
        self._load = load
        self.queue_size = queue_size
        self.parallel = parallel
        self._make_streams = streams
        self._queue: deque[Job] = deque()
        self._lock = threading.Lock()  # the queue, between the event loop and this thread
        self._wake = threading.Event()  # a job was queued, or the worker should leave
        self._debug = debug
        self._log = log or Log()
        self._thread = threading.Thread(target=self._main, name="specgen-serve", daemon=True)
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._closing = threading.Event()  # the thread should leave
        self._cutting = threading.Event()  # every answer ends now (finish "length", cut)
        self._slots: dict[int, tuple[Stream, Answering]] = {}  # id(job) -> its answer
        self._jobs: dict[int, Job] = {}
        self._ends: deque[float] = deque(maxlen=16)  # when recent jobs left: the drain rate
        self._answer_seconds = 1.0  # a running mean, when too few jobs have ended yet
        self.pipes: dict[str, Pipeline] = {}
        self.streams: Any = None
        self.metrics: Metrics | None = None
        self._token_names: dict[int, TokenNames] = {}  # per codec: logprobs' token texts
        self.early = Early(self, early, methods) if early is not None else None
        # with early answers, the load begins once the server listens (`go`): importing
        # torch holds the interpreter for long stretches, which would hold the start up
        self._go = threading.Event()
        if early is None:
            self._go.set()
        self.on_failure: Callable[[BaseException], None] = lambda e: None  # a late load's

    def start(self) -> dict[str, Pipeline]:
        """Load the pipelines in the worker thread; its error is raised here. With an
        early pipeline, return at once: the requests it cannot answer wait for the load,
        whose error goes to `on_failure`."""
        self._thread.start()
        if self.early is not None:
            self.pipes = self.early.start()
            return self.pipes
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.pipes

    def go(self) -> None:
        """The server is up: the load may begin."""
        self._go.set()

    @property
    def queued(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> int:
        return len(self._jobs) + (self.early.running if self.early else 0)

    @property
    def idle(self) -> bool:
        return not self.running and not self._queue

    @property
    def loading(self) -> bool:
        """The pipelines are still loading (early answers only)."""
        return not self._loaded.is_set()

    @property
    def load_error(self) -> BaseException | None:
        return self._load_error

    def slots(self) -> list[dict[str, Any]]:
        """Each busy slot's answer so far (/metrics; read from another thread: a copy)."""
        out = []
        for stream, answering in list(self._slots.values()):
            stats = answering.stats or stream.stats
            context = stats.prompt_tokens + stats.new_tokens
            out.append({"slot": stream.slot, "method": stream.method, "context": context,
                        "tokens": stats.new_tokens})  # fmt: skip
        return out

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise `Overloaded` when the queue is full."""
        with self._lock:
            if len(self._queue) >= self.queue_size:
                raise Overloaded(self.retry_after())
            self._queue.append(job)
        self._wake.set()
        if self.early is not None:
            self.early.wake.set()

    def retry_after(self) -> int:
        """Seconds until the full queue is expected to have a place: one job's share of
        the measured drain rate (the mean gap between the last jobs' ends, while busy),
        not the whole queue's time (a retry needs one place, not an empty queue)."""
        now = time.perf_counter()
        ends = [t for t in self._ends if now - t < 120]
        if len(ends) >= 2:
            gap = (ends[-1] - ends[0]) / (len(ends) - 1)
            since = now - ends[-1]  # the running jobs have been at it this long already
            wait = max(gap - since, gap / 2)
        else:
            wait = self._answer_seconds
        return max(1, min(60, math.ceil(wait)))

    def cut_all(self) -> None:
        """End the running answers between prefill chunks or at their next step, and every
        queued one at once (the server is stopping)."""
        self._cutting.set()
        self._wake.set()

    def close(self, timeout: float = 10) -> None:
        """Stop the thread; the jobs still queued end with a 503."""
        self._cutting.set()
        self._closing.set()
        self._wake.set()
        self._go.set()  # a load not begun ends at once
        if self._loaded.is_set():  # a load cut short (Ctrl-C) is not waited for
            self._thread.join(timeout=timeout)
        self._drain_queue()

    # the thread --------------------------------------------------------------------------
    def _main(self) -> None:
        self._go.wait()
        try:
            if self._closing.is_set():
                raise SpecgenError("the server stopped before the model loaded")
            pipes = self._load()
            for pipe in pipes.values():  # a cost table measured again gives way to requests
                pipe.busy = self._requests_wait
            streams = self._make_streams(pipes, self.parallel)
        except BaseException as e:  # handed to start(), raised in the main thread
            self._load_error = e
            self._loaded.set()
            if self.early is not None:  # the server was answering already: it stops
                self._drain_queue()
                self.on_failure(e)
            return
        with self._lock:  # from here on the early answers take no job
            self.pipes, self.streams = pipes, streams
            self._loaded.set()
        while not self._closing.is_set():
            self._admit()
            self._cut_left()
            if not self._slots:
                self._wake.wait(0.1)
                self._wake.clear()
                continue
            self._step()
        self._cut_left()  # closing: every answer still in a slot is cut
        self._drain_queue()

    def _requests_wait(self) -> bool:
        """Requests are queued, or the server is stopping (read without the lock: a stale
        answer only delays a cost measurement, or lets it run a moment longer)."""
        return bool(self._queue) or self._cutting.is_set()

    def _next(self) -> Job | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def _take(self, answerable: Callable[[Job], bool]) -> Job | None:
        """The first queued job `answerable` says yes to, while the pipelines load."""
        with self._lock:
            if self._loaded.is_set():
                return None
            for job in self._queue:
                if answerable(job):
                    self._queue.remove(job)
                    return job
        return None

    def _drain_queue(self) -> None:
        while (job := self._next()) is not None:
            self._end(job, Failed(client_gone() if job.cancel.is_set() else stopping()))

    def _admit(self) -> None:
        """Fill the free slots from the queue, in order."""
        while self.streams.free > 0 and (job := self._next()) is not None:
            if job.cancel.is_set():  # its client left while it waited
                self._end(job, Failed(client_gone()))
            elif self._cutting.is_set():  # the server is stopping: not started
                self._end(job, Failed(stopping()))
            else:
                self._guarded(job, lambda job=job: self._start(job))

    def _start(self, job: Job) -> None:
        pipe = self.pipes[job.method]
        pending = self._echo(job, pipe) if job.echo else Pending()
        if job.max_tokens == 0:  # echo alone: the prompt scored, nothing generated
            spec = report.empty(job.method, len(job.prompt_ids))
            self._end(job, Done("length", (len(job.prompt_ids), 0, 0), spec))
            return
        names = self._names(pipe) if job.sampling.logprobs is not None else None
        answering = Answering(job, pipe, self._post, names=names, pending=pending)
        stream = self.streams.open(
            job.prompt_ids, method=job.method, sampling=job.sampling,
            max_new_tokens=job.max_tokens, ignore_eos=job.ignore_eos,
            constraint=job.constraint, cancel=lambda: self._cancelled(job),
        )  # fmt: skip
        self._jobs[id(job)] = job
        self._slots[id(job)] = (stream, answering)

    def _step(self) -> None:
        """One step of every answer in a slot, each chunk to its job."""
        by_stream = {id(stream): job_id for job_id, (stream, _) in self._slots.items()}
        try:
            results = self.streams.step()
        except Exception as e:  # a bug beneath every answer: each of them ends with it
            for job_id in list(self._slots):
                self._finish(job_id, error=e)
            return
        for stream, got in results:
            job_id = by_stream[id(stream)]
            if isinstance(got, Exception):
                self._finish(job_id, error=got)
                continue
            _, answering = self._slots[job_id]
            try:
                over = answering.push(got)
            except Exception as e:  # the answer's own handling failed: it alone ends
                self._finish(job_id, error=e)
                continue
            if over:
                self._finish(job_id)

    def _cut_left(self) -> None:
        """End the answers whose client left, or all when the server is cutting."""
        for job_id in list(self._slots):
            job = self._jobs[job_id]
            if self._cancelled(job):
                self._finish(job_id, cut_by=CLIENT_GONE if job.cancel.is_set() else SHUTDOWN)

    def _finish(
        self, job_id: int, *, error: Exception | None = None, cut_by: str | None = None
    ) -> None:
        """The answer in a slot ends (done, cut, or with `error`): its slot is freed and
        its job gets its end event."""
        stream, answering = self._slots.pop(job_id)
        job = self._jobs.pop(job_id)
        try:
            self.streams.close(stream)  # its session settles (a no-op once it ended)
        except Exception as e:  # a bug settling: the job still ends, with it
            error = error or e
        self._ended(job, answering, error=error, cut_by=cut_by, slot=stream.slot)

    def _ended(self, job: Job, answering: Answering, *, error: Exception | None,
               cut_by: str | None, slot: int | None) -> None:  # fmt: skip
        """`job`'s end event, its answer over (done, cut by `cut_by`, or with `error`)."""
        self._ends.append(time.perf_counter())
        seconds = time.perf_counter() - job.queued_at - answering.queue_seconds
        self._answer_seconds = 0.8 * self._answer_seconds + 0.2 * seconds
        if error is not None:  # Cancelled (its prompt was being read) included
            self._guarded(job, lambda: _raise(error))
        elif cut_by is not None and not answering.produced:  # nothing was produced
            self._end(job, Failed(client_gone() if cut_by == CLIENT_GONE else stopping()))
        else:
            self._guarded(job, lambda: self._end(job, answering.done(self.metrics, cut_by, slot)))

    def _guarded(self, job: Job, run: Callable[[], None]) -> None:
        """Run `run` for `job`; whatever it raises ends the job with one end event."""
        try:
            run()
        except Cancelled:  # stopped between prefill chunks: nothing was produced
            self._end(job, Failed(client_gone() if job.cancel.is_set() else stopping()))
        except SpecgenError as e:  # input the checks before the queue could not see
            self._end(job, Failed(APIError(400, str(e))))
        except Exception as e:  # a bug: one line to the client, the log says more
            if self._debug:
                traceback.print_exception(e)
            where = _where(e)  # the innermost frame: enough for a bug report
            self._log.error(
                f"internal error: {type(e).__name__}: {e} at {where} (rerun with --debug)"
            )
            bug = APIError(
                500, f"internal error: {type(e).__name__}: {e} at {where}", code="internal_error"
            )
            self._end(job, Failed(bug))
        finally:
            if not job.ended and id(job) not in self._jobs:  # an end forgotten is a bug
                self._end(job, Failed(APIError(500, "internal error: the answer had no end",
                                               code="internal_error")))  # fmt: skip

    def _echo(self, job: Job, pipe: Pipeline) -> Pending:
        """Send the prompt's text (and with logprobs its logprobs, one prefill of the whole
        prompt in a session the answer then reuses); the answer's text follows it."""
        top = job.sampling.logprobs
        scored = None
        if top is not None:
            scored = self.streams.score(job.prompt_ids, method=job.method, top=top)
        names = self._names(pipe)
        text, entries = echoed(names, pipe.codec, job.prompt_ids, scored)
        self._post(job, Delta(text, report.running(GenStats(), 0), entries))
        return Pending(base=len(text))

    def _names(self, pipe: Pipeline) -> TokenNames:
        names = self._token_names.get(id(pipe.codec))
        if names is None:
            names = self._token_names[id(pipe.codec)] = TokenNames(pipe.codec)
        return names

    def _cancelled(self, job: Job) -> bool:
        return job.cancel.is_set() or self._cutting.is_set()

    def _end(self, job: Job, event: Done | Failed) -> None:
        """A job's one end event (a second is dropped: exactly one per job)."""
        if job.ended:
            return
        job.ended = True
        self._post(job, event)

    def _post(self, job: Job, event: Delta | Done | Failed) -> None:
        try:
            job.post(event)
        except RuntimeError:  # the event loop is gone (the server stopped): stop the answer
            job.cancel.set()


def _raise(error: BaseException) -> None:
    raise error


def _where(error: BaseException) -> str:
    """`file.py:line` of the frame that raised `error`."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "an unknown place"
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}"
