"""The one thread that owns the model: it loads the pipelines, then answers requests one
at a time, in the order they came, from a bounded queue.

One thread for all torch work (loading included) because the model, its KV caches and
the sessions that reuse cached prefixes are not thread-safe, and because on the CPU torch
runs slower from a thread other than the one whose OpenMP team it formed (docs/results.md).
The event loop only queues jobs and reads their events.

A job's events (`Delta`s, then exactly one end: `Done` or `Failed`) go to a callback that
must be safe to call from this thread (the server hands them to the event loop). Every
job that leaves the queue ends with one end event, whatever ended it: answered, its client
gone while it waited (`Failed` 499), cut by the server stopping before it produced
anything (`Failed` 503) or after (`Done` with `cut`), or a bug (`Failed` 500); a handler
waiting for it never waits forever. Cancelling (its client left, or the server is
stopping) ends the answer between two prefill chunks or at its next step: closing
`Pipeline.stream_ids` settles the session, so the next answer finds a consistent cache.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specgen.core.config import SamplingParams
from specgen.core.errors import Cancelled, SpecgenError
from specgen.core.stats import GenStats
from specgen.scheduling.speedup import modeled_speedup
from specgen.serve import report
from specgen.serve.errors import APIError
from specgen.serve.log import Log
from specgen.serve.logprobs import Entry, Pending, TokenNames, echoed
from specgen.serve.metrics import Metrics
from specgen.serve.stops import StopCut

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.verify.constraint import Constraint

# the two ways a job ends early, as `Failed` (nothing was produced) and in `Done.cut`
CLIENT_GONE = "client"  # its client disconnected
SHUTDOWN = "shutdown"  # the server is stopping


@dataclass(frozen=True)
class Delta:
    text: str
    spec: dict[str, Any]  # report.running: drafted_chars, totals so far
    logprobs: tuple[Entry, ...] = ()  # the tokens whose text starts in this delta


@dataclass(frozen=True)
class Done:
    finish: str  # OpenAI's: stop or length (a cut answer says "length": it is cut short)
    usage: tuple[int, int, int]  # prompt, completion, cached prompt tokens
    spec: dict[str, Any]  # report.final (with "cut" when the answer was cut)
    cut: str | None = None  # CLIENT_GONE or SHUTDOWN: why it ended before its end


@dataclass(frozen=True)
class Failed:
    error: APIError


@dataclass(eq=False)
class Job:
    method: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stops: tuple[str, ...]
    post: Callable[[Delta | Done | Failed], None]  # called from the worker thread
    # a chunk's text and drafted characters, when the answer is read otherwise than the
    # pipeline decodes it (tool calls whose markers are special tokens: serve/tools.py)
    text_of: Callable[[Any], tuple[str, int]] | None = None
    ignore_eos: bool = False  # stop tokens do not end the answer (guidellm asks it)
    echo: bool = False  # the prompt's text (with sampling.logprobs, its logprobs) first
    constraint: Constraint | None = None  # what the answer may say (serve/grammar.py)
    cancel: threading.Event = field(default_factory=threading.Event)  # its client left
    queued_at: float = field(default_factory=time.perf_counter)
    ended: bool = False  # its end event was posted (set by the worker thread)


def client_gone() -> APIError:
    return APIError(499, "the client closed the request", code="client_closed")


def stopping() -> APIError:
    return APIError(
        503, "the server is stopping; the request was not answered (retry elsewhere or later)",
        code="shutting_down",
    )  # fmt: skip


class Overloaded(Exception):
    """The queue is full; `retry_after` seconds is when a place is expected to free up."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"retry after {retry_after} s")
        self.retry_after = retry_after


class Worker:
    def __init__(
        self,
        load: Callable[[], dict[str, Pipeline]],
        *,
        queue_size: int,
        debug: bool = False,
        log: Log | None = None,
    ) -> None:
        self._load = load
        self._jobs: queue.Queue[Job] = queue.Queue(maxsize=queue_size)
        self._debug = debug
        self._log = log or Log()
        self._thread = threading.Thread(target=self._main, name="specgen-serve", daemon=True)
        self._loaded = threading.Event()
        self._load_error: BaseException | None = None
        self._closing = threading.Event()  # the thread should leave
        self._cutting = threading.Event()  # every answer ends now (finish "length", cut)
        self._running: Job | None = None
        self._ends: deque[float] = deque(maxlen=16)  # when recent jobs left: the drain rate
        self._answer_seconds = 1.0  # a running mean, when too few jobs have ended yet
        self.pipes: dict[str, Pipeline] = {}
        self.metrics: Metrics | None = None
        self._token_names: dict[int, TokenNames] = {}  # per codec: logprobs' token texts

    def start(self) -> dict[str, Pipeline]:
        """Load the pipelines in the worker thread; its error is raised here."""
        self._thread.start()
        self._loaded.wait()
        if self._load_error is not None:
            raise self._load_error
        return self.pipes

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    @property
    def running(self) -> int:
        return int(self._running is not None)

    @property
    def idle(self) -> bool:
        return self._running is None and self._jobs.empty()

    def submit(self, job: Job) -> None:
        """Queue `job`, or raise `Overloaded` when the queue is full."""
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise Overloaded(self.retry_after()) from None

    def retry_after(self) -> int:
        """Seconds until the full queue is expected to have a place: one job's share of
        the measured drain rate (the mean gap between the last jobs' ends, while busy),
        not the whole queue's time (a retry needs one place, not an empty queue)."""
        now = time.perf_counter()
        ends = [t for t in self._ends if now - t < 120]
        if len(ends) >= 2:
            gap = (ends[-1] - ends[0]) / (len(ends) - 1)
            since = now - ends[-1]  # the running job has been at it this long already
            wait = max(gap - since, gap / 2)
        else:
            wait = self._answer_seconds
        return max(1, min(60, math.ceil(wait)))

    def cut_all(self) -> None:
        """End the running answer between prefill chunks or at its next step, and every
        queued one at once (the server is stopping)."""
        self._cutting.set()

    def close(self, timeout: float = 10) -> None:
        """Stop the thread; the jobs still queued end with a 503."""
        self._cutting.set()
        self._closing.set()
        if self._loaded.is_set():  # a load cut short (Ctrl-C) is not waited for
            self._thread.join(timeout=timeout)
        self._drain_queue()

    def _drain_queue(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            self._end(job, Failed(client_gone() if job.cancel.is_set() else stopping()))

    def _main(self) -> None:
        try:
            self.pipes = self._load()
        except BaseException as e:  # handed to start(), raised in the main thread
            self._load_error = e
            return
        finally:
            self._loaded.set()
        while not self._closing.is_set():
            try:
                job = self._jobs.get(timeout=0.1)
            except queue.Empty:
                continue
            self._running = job
            start = time.perf_counter()
            try:
                self._answer(job)
            finally:
                self._running = None
                end = time.perf_counter()
                self._ends.append(end)
                self._answer_seconds = 0.8 * self._answer_seconds + 0.2 * (end - start)
        self._drain_queue()

    def _answer(self, job: Job) -> None:
        """Run `job`; whatever happens, it ends with exactly one end event."""
        try:
            if job.cancel.is_set():  # its client left while it waited
                self._end(job, Failed(client_gone()))
            elif self._cutting.is_set():  # the server is stopping: not started
                self._end(job, Failed(stopping()))
            else:
                self._generate(job)
        except Cancelled:  # stopped between prefill chunks: nothing was produced
            self._end(job, Failed(client_gone() if job.cancel.is_set() else stopping()))
        except SpecgenError as e:  # input the checks before the queue could not see
            self._end(job, Failed(APIError(400, str(e))))
        except Exception as e:  # a bug: one line to the client, the log says more
            if self._debug:
                traceback.print_exc()
            where = _where(e)  # the innermost frame: enough for a bug report
            self._log.error(
                f"internal error: {type(e).__name__}: {e} at {where} (rerun with --debug)"
            )
            bug = APIError(
                500, f"internal error: {type(e).__name__}: {e} at {where}", code="internal_error"
            )
            self._end(job, Failed(bug))
        finally:
            if not job.ended:  # a path above that forgot its end is a bug, not a hang
                self._end(job, Failed(APIError(500, "internal error: the answer had no end",
                                               code="internal_error")))  # fmt: skip

    def _generate(self, job: Job) -> None:
        queue_seconds = time.perf_counter() - job.queued_at
        pipe = self.pipes[job.method]
        pending = self._echo(job, pipe) if job.echo else Pending()
        if job.max_tokens == 0:  # echo alone: the prompt scored, nothing generated
            spec = report.empty(job.method, len(job.prompt_ids))
            self._end(job, Done("length", (len(job.prompt_ids), 0, 0), spec))
            return
        names = self._names(pipe) if job.sampling.logprobs is not None else None
        cut = StopCut(job.stops)
        extra: dict[str, Any] = {"ignore_eos": True} if job.ignore_eos else {}
        if job.constraint is not None:
            extra["constraint"] = job.constraint
        stream = pipe.stream_ids(
            job.prompt_ids, sampling=job.sampling, max_new_tokens=job.max_tokens,
            cancel=lambda: self._cancelled(job), **extra,
        )  # fmt: skip
        stats = None
        finish = None
        cut_by: str | None = None

        def send(pieces) -> None:
            for piece in pieces:
                running = report.running(stats, piece.drafted)
                self._post(job, Delta(piece.text, running, pending.release(len(piece.text))))

        try:
            for chunk in stream:
                stats = chunk.stats
                text, drafted = (chunk.text, chunk.draft_chars)
                if job.text_of is not None:
                    text, drafted = job.text_of(chunk)
                if names is not None:
                    pending.add(names, chunk)
                send(cut.push(text, drafted))
                if cut.stopped:
                    finish = "stop"
                    break
                if stats.finish_reason is None and self._cancelled(job):
                    finish = "length"  # cut short; who cut it is said in `cut`
                    cut_by = CLIENT_GONE if job.cancel.is_set() else SHUTDOWN
                    break
        finally:
            stream.close()  # the pipeline settles the session (a consistent cache)
        assert stats is not None  # a stream yields the prefill's step at least
        if finish is None:
            send(cut.flush())
            rest = pending.rest()  # tokens that added no text (a stop token let through)
            if rest:
                self._post(job, Delta("", report.running(stats, 0), rest))
            # the context filling up is a length limit to an OpenAI client
            finish = "length" if stats.finish_reason in ("length", "context") else "stop"
        if self.metrics is not None:
            # a cut answer is counted by who cut it (its OpenAI finish is "length")
            self.metrics.answer(stats, finish if cut_by is None else f"cut_{cut_by}")
        cached = stats.prompt_tokens - stats.prefill_tokens
        if job.echo and job.sampling.logprobs is not None:
            cached = 0  # this request's own scoring pass computed the prompt, not a cache
        usage = (stats.prompt_tokens, stats.new_tokens, cached)
        speedup = modeled_speedup(stats, pipe.costs)
        spec = report.final(stats, queue_seconds=queue_seconds, speedup=speedup)
        if cut_by is not None:
            spec["cut"] = cut_by
        self._end(job, Done(finish, usage, spec, cut_by))

    def _echo(self, job: Job, pipe: Pipeline) -> Pending:
        """Send the prompt's text (and with logprobs its logprobs, one prefill of the whole
        prompt that the answer then reuses); the answer's text follows it."""
        top = job.sampling.logprobs
        scored = None if top is None else pipe.prompt_logprobs(job.prompt_ids, top=top)
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


def _where(error: BaseException) -> str:
    """`file.py:line` of the frame that raised `error`."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return "an unknown place"
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}"
