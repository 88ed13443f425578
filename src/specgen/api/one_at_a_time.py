"""`Streams`' interface (open / step / close / score) over `Pipeline.stream_ids`, one answer
at a time: what `specgen serve --parallel 1` runs.

An answer here is a pipeline's own stream on its own session, so it takes that
pipeline's fastest way to answer alone (on CUDA the device-resident loop in the overlap
engine, which stepping answers together gives up) and its one cached conversation, as
the server did before it had slots. `step` takes the stream's next chunk.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from specgen.api.pipeline import Chunk
from specgen.core.config import DEFAULT_MAX_NEW_TOKENS, SamplingParams
from specgen.core.errors import SpecgenError
from specgen.core.events import TokenLogprob
from specgen.core.stats import GenStats
from specgen.engine.batch import Counters
from specgen.verify.constraint import Constraint


@dataclass(eq=False)
class Running:
    """The answer being generated: its pipeline's stream."""

    method: str
    chunks: Iterator[Chunk]
    slot: int = 0
    stats: GenStats = field(default_factory=GenStats)  # the last chunk's


class OneAtATime:
    """One answer at a time over `pipes` (method -> pipeline, or anything with
    `stream_ids` and `prompt_logprobs`); the first serves `open` calls naming no method."""

    def __init__(self, pipes: Mapping[str, Any], parallel: int = 1) -> None:
        if parallel != 1:
            raise SpecgenError(f"one answer at a time runs one (got parallel {parallel})")
        self.pipes = dict(pipes)
        self.parallel = 1
        self.active: list[Running] = []
        self.counters = Counters()

    @property
    def free(self) -> int:
        return 1 - len(self.active)

    def open(
        self,
        prompt_ids: Sequence[int],
        *,
        method: str | None = None,
        sampling: SamplingParams | None = None,
        max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
        ignore_eos: bool = False,
        constraint: Constraint | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> Running:
        if self.active:
            raise SpecgenError("one answer at a time: close the running one first")
        method = method or next(iter(self.pipes))
        extra: dict[str, Any] = {"ignore_eos": True} if ignore_eos else {}
        if constraint is not None:
            extra["constraint"] = constraint
        chunks = self.pipes[method].stream_ids(
            list(prompt_ids), sampling=sampling, max_new_tokens=max_new_tokens, cancel=cancel,
            **extra,
        )  # fmt: skip
        running = Running(method, chunks)
        self.active.append(running)
        return running

    def step(self) -> list[tuple[Running, Chunk | Exception]]:
        """The running answer's next chunk (or the error that ended it)."""
        if not self.active:
            return []
        running = self.active[0]
        self.counters.steps += 1
        self.counters.answers += 1
        self.counters.by_size[1] = self.counters.by_size.get(1, 0) + 1
        try:
            chunk = next(running.chunks)
        except StopIteration:  # (a stream ends with a finishing chunk: not reached)
            self.close(running)
            return []
        except Exception as e:
            self.close(running)
            return [(running, e)]
        running.stats = chunk.stats
        if chunk.stats.finish_reason is not None:
            self.close(running)
        return [(running, chunk)]

    def close(self, running: Running) -> None:
        """End it now: closing the stream settles its session."""
        if running in self.active:
            self.active.remove(running)
            running.chunks.close()

    def score(
        self, prompt_ids: Sequence[int], *, method: str | None = None, top: int = 0
    ) -> list[TokenLogprob]:
        pipe = self.pipes[method or next(iter(self.pipes))]
        return pipe.prompt_logprobs(list(prompt_ids), top=top)
