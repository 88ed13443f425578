"""A job being answered in a slot: the pipeline's chunks made into the job's events (text
held back and cut at stop strings, logprob entries sent with the text they belong to,
tool-call markers read as text), and its one `Done` when it ends, however it ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from specgen.scheduling.speedup import modeled_speedup
from specgen.serve import report
from specgen.serve.job import Delta, Done, Job
from specgen.serve.logprobs import Pending, TokenNames
from specgen.serve.stops import StopCut

if TYPE_CHECKING:
    from specgen.api.pipeline import Chunk, Pipeline
    from specgen.serve.metrics import Metrics


class Answering:
    """`job`'s answer from `pipe` as it comes; `post` hands the job its events."""

    def __init__(
        self,
        job: Job,
        pipe: Pipeline,
        post: Callable[[Job, Delta], None],
        *,
        names: TokenNames | None,
        pending: Pending,
    ) -> None:
        self.job = job
        self.pipe = pipe
        self.post = post
        self.names = names  # set when logprobs are asked for
        self.pending = pending
        self.cut = StopCut(job.stops)
        self.queue_seconds = time.perf_counter() - job.queued_at
        self.stats = None  # the last chunk's (running totals)
        self.finish: str | None = None  # set once the answer is over

    @property
    def produced(self) -> bool:
        """Whether a chunk came (the prefill is done): a cut answer then still ends with
        `Done`, one that never produced anything with `Failed`."""
        return self.stats is not None

    def push(self, chunk: Chunk) -> bool:
        """One chunk of the answer; True once it is over (a stop string was found, or its
        last chunk came)."""
        job = self.job
        self.stats = chunk.stats
        text, drafted = chunk.text, chunk.draft_chars
        if job.text_of is not None:
            text, drafted = job.text_of(chunk)
        if self.names is not None:
            self.pending.add(self.names, chunk)
        self._send(self.cut.push(text, drafted))
        if self.cut.stopped:
            self.finish = "stop"
            return True
        reason = chunk.stats.finish_reason
        if reason is None:
            return False
        self._send(self.cut.flush())
        rest = self.pending.rest()  # tokens that added no text (a stop token let through)
        if rest:
            self.post(job, Delta("", report.running(self.stats, 0), rest))
        # the context filling up is a length limit to an OpenAI client
        self.finish = "length" if reason in ("length", "context") else "stop"
        return True

    def done(
        self, metrics: Metrics | None, cut_by: str | None = None, slot: int | None = None
    ) -> Done:
        """The answer's end event; `cut_by` (CLIENT_GONE, SHUTDOWN) when it was cut short
        (its finish is then "length", as OpenAI says of an answer cut short)."""
        stats = self.stats
        assert stats is not None  # produced
        finish = "length" if cut_by is not None else self.finish or "length"
        if metrics is not None:  # a cut answer is counted by who cut it
            metrics.answer(stats, finish if cut_by is None else f"cut_{cut_by}", slot)
        cached = stats.prompt_tokens - stats.prefill_tokens
        if self.job.echo and self.job.sampling.logprobs is not None:
            cached = 0  # this request's own scoring pass computed the prompt, not a cache
        usage = (stats.prompt_tokens, stats.new_tokens, cached)
        speedup = modeled_speedup(stats, self.pipe.costs)
        spec: dict[str, Any] = report.final(
            stats, queue_seconds=self.queue_seconds, speedup=speedup
        )
        if cut_by is not None:
            spec["cut"] = cut_by
        return Done(finish, usage, spec, cut_by)

    def _send(self, pieces) -> None:
        for piece in pieces:
            running = report.running(self.stats, piece.drafted)
            released = self.pending.release(len(piece.text))
            self.post(self.job, Delta(piece.text, running, released))
