"""Several answers at once on one target: the library's continuous batching, which the
server's worker is one user of.

    streams = Streams(pipe, parallel=4)
    a = streams.open(pipe.encode("Why is the sky blue?"))
    b = streams.open(pipe.encode("Tell me a joke"), sampling=SamplingParams(temperature=0.7))
    while streams.active:
        for stream, chunk in streams.step():   # one step of every open answer
            print(stream.slot, chunk.text)

Each open answer holds a slot and a session of its method's pipeline (its KV cache and
drafter), taken from a pool per method: the idle session whose cache shares the longest
prefix with the prompt, so a conversation's next turn prefills only what is new (the
chat prefix reuse a single pipeline has). Each `step` is one step of every open answer
(engine/batch.py): a prefill chunk of those still reading their prompts, a decoding or
speculative step of the others, their target forwards together. An answer opened between
two steps joins at the next; one that ends or is closed frees its slot and session at once.
Every answer is the one `Pipeline.stream_ids` gives alone: greedy token for token, a
seeded sample draw for draw (it drafts as if alone). An unseeded sampled answer is drawn
from the same distribution; under the cost policy its drafting weighs the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from specgen.api.pipeline import Chunk, Completion, Pipeline, Prompt, chunk_of
from specgen.core.config import DEFAULT_MAX_NEW_TOKENS, SamplingParams, checked_max_new_tokens
from specgen.core.errors import OptionError, SpecgenError
from specgen.core.events import StepEvent, TokenLogprob
from specgen.core.stats import GenStats
from specgen.engine.batch import Batch, Counters
from specgen.engine.prefill import CHUNK, SHARED_CHUNK
from specgen.engine.session import Session
from specgen.engine.stepper import Stepper
from specgen.scheduling.batch import OneForward
from specgen.text.codec import Detokenizer
from specgen.verify.constraint import Constraint

DEFAULT_PARALLEL = 4  # answers at once when the caller does not say


@dataclass(eq=False)
class Stream:
    """One open answer: its chunks come out of `Streams.step`."""

    pipe: Pipeline
    session: Session
    stepper: Stepper
    stats: GenStats
    prompt_ids: list[int]
    slot: int  # 0..parallel-1, held until it ends
    output: list[int] = field(default_factory=list)
    ended: bool = False  # finished, failed or closed: its slot and session are free
    alone: bool = True  # no step of it was shared (its step times then judge the costs)
    detok: Detokenizer | None = None

    @property
    def method(self) -> str:
        return self.pipe.spec.method

    @property
    def prefilling(self) -> bool:
        """Still reading its prompt: nothing has come out of it yet."""
        return self.stepper.prefilling

    def _take(self, event: StepEvent) -> Chunk:
        assert self.detok is not None
        self.output.extend(event.tokens)
        self.stats.record(event)
        return chunk_of(event, self.detok, self.stats)


class Streams:
    """Up to `parallel` answers at once over `pipes` (method -> pipeline, usually several
    methods on one target, `Pipeline.with_spec`; the first serves `open` calls that name
    no method)."""

    def __init__(
        self,
        pipes: Pipeline | Mapping[str, Pipeline],
        parallel: int = DEFAULT_PARALLEL,
        *,
        chunk: int | None = None,
    ) -> None:
        if parallel < 1:
            raise OptionError("parallel", "must be at least 1", parallel)
        if isinstance(pipes, Pipeline):
            pipes = {pipes.spec.method: pipes}
        if not pipes:
            raise SpecgenError("Streams needs at least one pipeline")
        self.pipes = dict(pipes)
        self.parallel = parallel
        # one pass for every answer's rows where the target can: a step is then priced
        # as one forward of all of them, else as each answer's own forward
        shared = next(iter(self.pipes.values())).model.shared_passes
        if chunk is None:  # short chunks only where they leave every row's bits as they are
            chunk = SHARED_CHUNK if shared else CHUNK
        if chunk < 1:
            raise OptionError("chunk", "must be at least 1", chunk)
        self.chunk = chunk  # prompt tokens per prefill chunk (engine/prefill.py)
        self.batch = Batch(OneForward() if shared else None, prompt_rows=chunk)
        self.active: list[Stream] = []
        self._idle: dict[str, list[Session]] = {m: [] for m in self.pipes}  # last: newest
        self._made: dict[str, int] = dict.fromkeys(self.pipes, 0)

    @property
    def free(self) -> int:
        """Slots free now."""
        return self.parallel - len(self.active)

    @property
    def counters(self) -> Counters:
        return self.batch.counters

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
    ) -> Stream:
        """Open an answer to `prompt_ids`; it joins the next `step`. The options are
        `Pipeline.stream_ids`'s. Raises `SpecgenError` when every slot is taken."""
        if not self.free:
            raise SpecgenError(f"all {self.parallel} slots are answering; step until one ends")
        pipe = self._pipe(method)
        checked_max_new_tokens(max_new_tokens)
        prompt = list(prompt_ids)
        params = sampling or SamplingParams()
        session = self._session(pipe, prompt)
        try:
            new_ids, stats = pipe.prepare_answer(session, prompt, params)
        except BaseException:
            self._release(pipe, session)
            raise
        stepper = Stepper(
            session, new_ids, params=params, max_new_tokens=max_new_tokens,
            stop_ids=frozenset() if ignore_eos else pipe.codec.stop_ids,
            constraint=constraint, cancel=cancel, chunk=self.chunk,
        )  # fmt: skip
        taken = {s.slot for s in self.active}
        slot = next(i for i in range(self.parallel) if i not in taken)
        stream = Stream(pipe, session, stepper, stats, prompt, slot, detok=Detokenizer(pipe.codec))
        self.active.append(stream)
        return stream

    def step(self) -> list[tuple[Stream, Chunk | Exception]]:
        """One step of every open answer: what each produced (a prefill chunk that is not
        its last produces nothing), or the error that ended it. An answer whose chunk
        finishes it (`chunk.stats.finish_reason`), or that failed, has ended."""
        live = list(self.active)
        outcomes = self.batch.step([s.stepper for s in live])
        shared = len(live) > 1
        out: list[tuple[Stream, Chunk | Exception]] = []
        for stream, outcome in zip(live, outcomes, strict=True):
            stream.alone = stream.alone and not shared
            if outcome.error is not None:
                self._end(stream)
                out.append((stream, outcome.error))
            elif outcome.event is not None:
                out.append((stream, stream._take(outcome.event)))
                if outcome.event.finish is not None:
                    self._end(stream, finished=True)
        return out

    def close(self, stream: Stream) -> None:
        """End `stream` now (cut short if it had not finished): its session keeps what its
        cache holds, and its slot is free."""
        self._end(stream)

    def score(
        self, prompt_ids: Sequence[int], *, method: str | None = None, top: int = 0
    ) -> list[TokenLogprob]:
        """`Pipeline.prompt_logprobs` in a session of the pool, which then holds the prompt:
        an answer opened to it next prefills one token. Runs at once (between steps)."""
        pipe = self._pipe(method)
        prompt = list(prompt_ids)
        session = self._session(pipe, prompt)
        try:
            return pipe.prompt_logprobs(prompt, top=top, session=session)
        finally:
            self._release(pipe, session)

    def _pipe(self, method: str | None) -> Pipeline:
        if method is None:
            return next(iter(self.pipes.values()))
        if method not in self.pipes:
            loaded = ", ".join(self.pipes)
            raise SpecgenError(f"method {method!r} is not loaded here; loaded: {loaded}")
        return self.pipes[method]

    def _session(self, pipe: Pipeline, prompt: list[int]) -> Session:
        """The idle session of `pipe`'s pool whose cache shares most of `prompt`; with none
        sharing anything, a new one while the pool may grow (others keep their caches for
        their conversations), else the least recently used."""
        method = pipe.spec.method
        idle = self._idle[method]
        best = max(range(len(idle)), key=lambda i: (_shared(idle[i].ids, prompt), i), default=None)
        if best is not None and _shared(idle[best].ids, prompt) > 0:
            return idle.pop(best)
        if self._made[method] < self.parallel:
            self._made[method] += 1
            return pipe.new_session()
        assert idle, "a pool holds `parallel` sessions and at most parallel - 1 are busy"
        return pipe.renew(idle.pop(0))

    def _release(self, pipe: Pipeline, session: Session) -> None:
        self._idle[pipe.spec.method].append(session)

    def _end(self, stream: Stream, *, finished: bool = False) -> None:
        if stream.ended:
            return
        stream.ended = True
        self.active.remove(stream)
        pipe = stream.pipe
        try:
            pipe.settle_answer(stream.session, stream.prompt_ids, stream.output)
            if finished and stream.alone:
                pipe.judge_costs(stream.stats, stream.session)
        finally:
            self._release(pipe, stream.session)


def _shared(ids: Sequence[int], prompt: Sequence[int]) -> int:
    n = min(len(ids), len(prompt) - 1)  # as Session.prepare: one token is always prefilled
    i = 0
    while i < n and ids[i] == prompt[i]:
        i += 1
    return i


def stream_many(
    pipe: Pipeline,
    prompts: Sequence[Prompt],
    *,
    parallel: int = DEFAULT_PARALLEL,
    sampling: SamplingParams | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    raw: bool = False,
    think: bool | None = None,
) -> Iterator[tuple[int, Chunk]]:
    """Answer every prompt, `parallel` at a time, in one batch: (prompt index, chunk) as
    they come; a new prompt starts as soon as a slot frees."""
    ids = [pipe.encode(p, raw=raw, think=think) for p in prompts]
    yield from stream_many_ids(
        pipe, ids, parallel=parallel, sampling=sampling, max_new_tokens=max_new_tokens
    )


def stream_many_ids(
    pipe: Pipeline,
    ids: Sequence[Sequence[int]],
    *,
    parallel: int = DEFAULT_PARALLEL,
    sampling: SamplingParams | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
) -> Iterator[tuple[int, Chunk]]:
    """`stream_many` for prompts already turned into token ids."""
    streams = Streams(pipe, parallel)
    index: dict[int, int] = {}
    waiting = list(range(len(ids)))[::-1]
    try:
        while waiting or streams.active:
            while waiting and streams.free:
                i = waiting.pop()
                s = streams.open(ids[i], sampling=sampling, max_new_tokens=max_new_tokens)
                index[id(s)] = i
            for stream, got in streams.step():
                if isinstance(got, Exception):
                    raise got
                yield index[id(stream)], got
    finally:
        for stream in list(streams.active):
            streams.close(stream)


def generate_many(pipe: Pipeline, prompts: Sequence[Prompt], **options) -> list[Completion]:
    """Every prompt's `Completion`, in order (the options are `stream_many`'s)."""
    ids: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[TokenLogprob]] = [[] for _ in prompts]
    stats = [GenStats() for _ in prompts]
    for i, chunk in stream_many(pipe, prompts, **options):
        ids[i].extend(chunk.token_ids)
        logprobs[i].extend(chunk.logprobs)
        stats[i] = chunk.stats
    sampling = options.get("sampling")
    asked = sampling is not None and sampling.logprobs is not None
    return [
        Completion(p, pipe.codec.decode(t), t, s, lp if asked else None)
        for p, t, s, lp in zip(prompts, ids, stats, logprobs, strict=True)
    ]
