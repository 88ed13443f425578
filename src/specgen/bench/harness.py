"""`specgen bench`: every method on the same prompts in one process, AR as the baseline.

Protocol (Spec-Bench's): one warm-up generation per method, then for each prompt every
method in turn (the order alternates between prompts so drift hits all alike), each from a
fresh session so no method reuses another's cache, `repeats` times with the median time
kept (a new session starts from the acceptance estimates its method's last answer left, as
a long-running user's would). On CUDA a method's one session is renewed instead (emptied,
a new scheduler), so its
CUDA graphs are captured once per method rather than inside every timed run. AR runs in
the same harness on the same loaded target. At temperature 0 every
method's tokens are compared with AR's; where they differ, the target's logit margin
(top-1 minus top-2) at the first divergent position says whether it is a near-tie (expected
in bf16) or a bug (anything in fp32).

Endpoints (bench/endpoint.py) take their turn in the same rotation, one streamed request
per prompt and repeat, as one more "method" each. At temperature 0 their answers are
compared with AR's too: by token ids where the server sends them, else by text (the
divergent position is then AR's first token whose text the server's answer leaves).
Without a local AR, an endpoint asked for specgen's `ar` method is the baseline.

A conversation (a suite's prompt with several user turns, `--turns all`) is answered turn
by turn, each turn asked with the conversation so far: the user turns and the method's
own earlier answers. Locally one session holds it (its cached prefix reused, as `chat`
and `serve` reuse it); each repeat of a turn starts from where the turn started. Every
turn is one timed run, compared with AR's same turn.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specgen.api.pipeline import Pipeline
from specgen.bench.endpoint import EndpointClient
from specgen.bench.modeled import prices_of
from specgen.bench.stream import ServedStats
from specgen.bench.suites import BenchPrompt
from specgen.bench.transformers_baseline import TransformersBaseline
from specgen.core.config import AR, SamplingParams
from specgen.core.stats import GenStats
from specgen.engine.session import Session
from specgen.scheduling.cost import modeled

Progress = Callable[[str], None]  # called after each generation with a short label


@dataclass
class PromptRun:
    method: str
    category: str
    prompt: int  # index in the suite
    tokens: list[int]
    seconds: float  # median over repeats, prefill included
    ttft_seconds: float  # median over repeats
    stats: GenStats  # counters of the first repeat (identical across greedy repeats)
    modeled: tuple[int, float] | None = None  # (tokens, seconds) after the prefill, priced
    # by the bench's cost table (bench/modeled.py); None where nothing could price it
    text: str = ""  # the answer's text as streamed
    remote: bool = False  # an endpoint's answer: `stats` holds only what the server said
    served: ServedStats | None = None  # an endpoint's speculative statistics, if it sent any
    turn: int = 0  # its user turn, in a conversation
    prompt_ids: list[int] = field(default_factory=list)  # what a local run was asked


@dataclass
class Divergence:
    method: str
    category: str
    prompt: int
    position: int  # first answer token that differs from AR's
    margin: float | None  # the target's top-1 minus top-2 logit there (AR's context;
    # None where no local AR ran)
    turn: int = 0


@dataclass
class BenchRun:
    runs: list[PromptRun] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)  # greedy answers compared with AR
    identical: dict[str, int] = field(default_factory=dict)
    memory_bytes: dict[str, int] = field(default_factory=dict)
    baseline: str | None = None  # what speedups divide by: AR, or an endpoint's `ar`


def run_bench(
    pipes: dict[str, Pipeline | TransformersBaseline],
    prompts: list[BenchPrompt],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int = 1,
    progress: Progress | None = None,
    endpoints: dict[str, EndpointClient] | None = None,
    think: bool | None = None,
) -> BenchRun:
    """Run every pipeline and endpoint on every prompt. `pipes`, unless empty (endpoints
    only), must contain `AR` (a Pipeline); "hf" may be transformers' own generate on the
    same checkpoint. `think`: the chat template's thinking mode (None: the model's)."""
    endpoints = endpoints or {}
    if pipes and not isinstance(pipes.get(AR), Pipeline):
        raise ValueError("the benchmark needs the AR baseline")
    if not pipes and not endpoints:
        raise ValueError("nothing to benchmark")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    result = BenchRun()
    names = [*pipes, *endpoints]
    ar = pipes.get(AR)
    assert ar is None or isinstance(ar, Pipeline)
    fresh = _FreshSessions()
    prices = prices_of(p.costs for p in pipes.values() if isinstance(p, Pipeline))
    for pipe in pipes.values():  # warm-up: first-call allocations, kernel selection, caches
        if isinstance(pipe, TransformersBaseline):
            pipe.run(ar.encode("Hello"), 8, sampling)
        else:
            pipe.generate("Hello", max_new_tokens=8, session=fresh(pipe))
    # (endpoints were warmed up when they were probed)
    # what the endpoints are asked for: the mode the local target's prompts were built in
    served_think = think if think is not None or ar is None else ar.thinking
    baseline = (
        AR if ar is not None else next((n for n, c in endpoints.items() if c.method == AR), None)
    )
    result.baseline = baseline
    for i, prompt in enumerate(prompts):
        order = names if i % 2 == 0 else names[::-1]
        answers: dict[str, list[PromptRun]] = {}
        for name in order:
            if name in endpoints:
                runs = _ask(
                    endpoints[name], name, prompt, i, max_new_tokens, sampling, repeats,
                    served_think,
                )  # fmt: skip
            else:
                runs = _run_one(
                    pipes[name], name, prompt, i, max_new_tokens, sampling, repeats, fresh,
                    ar, think,
                )  # fmt: skip
                for run in runs:
                    if prices is not None and run.stats.shapes:
                        run.modeled = modeled(run.stats.shapes, prices)
                result.memory_bytes[name] = max(
                    result.memory_bytes.get(name, 0), _memory(pipes[name])
                )
            result.runs.extend(runs)
            answers[name] = runs
            if progress:
                for _ in runs:
                    progress(f"{name} · {prompt.category} {i + 1}/{len(prompts)}")
        if sampling.greedy and baseline is not None:
            for turn in range(len(prompt.turns)):
                at = {n: runs[turn] for n, runs in answers.items() if turn < len(runs)}
                _compare(result, ar, baseline, prompt, i, turn, at)
    return result


class _FreshSessions:
    """A session in the state of a new one, for each run. On CUDA one per method, renewed
    (`Pipeline.renew`): the same state, but its CUDA graphs are captured once."""

    def __init__(self) -> None:
        self._kept: dict[int, Session] = {}

    def __call__(self, pipe: Pipeline) -> Session:
        if pipe.model.device.type != "cuda":
            return pipe.new_session()
        kept = self._kept.get(id(pipe))
        if kept is None:
            kept = self._kept[id(pipe)] = pipe.new_session()
            return kept
        return pipe.renew(kept)


def _run_one(
    pipe: Pipeline | TransformersBaseline,
    name: str,
    prompt: BenchPrompt,
    index: int,
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int,
    fresh: _FreshSessions,
    ar: Pipeline,
    think: bool | None,
) -> list[PromptRun]:
    """One run per user turn of `prompt` (one, unless it is a conversation), each prompt
    built by AR's pipeline (one tokenizer and template for every method)."""
    runs: list[PromptRun] = []
    history: list[dict[str, str]] = []
    session = None if isinstance(pipe, TransformersBaseline) else fresh(pipe)
    for turn, user in enumerate(prompt.turns):
        history.append({"role": "user", "content": user})
        ids = ar.encode(list(history) if turn else user, think=think)
        run = _run_turn(pipe, name, prompt, index, ids, max_new_tokens, sampling, repeats, session)
        run.turn, run.prompt_ids = turn, ids
        runs.append(run)
        history.append({"role": "assistant", "content": run.text or ar.codec.decode(run.tokens)})
    return runs


def _run_turn(
    pipe: Pipeline | TransformersBaseline,
    name: str,
    prompt: BenchPrompt,
    index: int,
    ids: list[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int,
    session: Session | None,
) -> PromptRun:
    times, ttfts, first = [], [], None
    start = list(session.ids) if session is not None else []
    for repeat in range(repeats):
        if pipe.model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pipe.model.device)
        tokens: list[int] = []
        text: list[str] = []
        stats = GenStats()
        if isinstance(pipe, TransformersBaseline):
            tokens, stats = pipe.run(ids, max_new_tokens, sampling)
        else:
            assert session is not None
            session.settle(start)  # each repeat from where the turn started
            # every repeat drafts from what the earlier prompts left (suffix's store):
            # only the last one leaves its answer there
            chunks = pipe.stream_ids(
                ids, sampling=sampling, max_new_tokens=max_new_tokens, session=session,
                remember=repeat == repeats - 1,
            )  # fmt: skip
            for chunk in chunks:
                tokens.extend(chunk.token_ids)
                text.append(chunk.text)
                stats = chunk.stats
        times.append(stats.seconds)
        ttfts.append(stats.ttft_seconds or 0.0)
        if first is None:
            first = (tokens, stats, "".join(text))
    assert first is not None
    return PromptRun(
        method=name,
        category=prompt.category,
        prompt=index,
        tokens=first[0],
        seconds=statistics.median(times),
        ttft_seconds=statistics.median(ttfts),
        stats=first[1],
        text=first[2],
    )


def _ask(
    client: EndpointClient,
    name: str,
    prompt: BenchPrompt,
    index: int,
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int,
    think: bool | None,
) -> list[PromptRun]:
    """Each user turn of `prompt` as one chat request (the conversation so far, with the
    endpoint's own earlier answers) to an endpoint, `repeats` times (median times)."""
    runs: list[PromptRun] = []
    history: list[dict[str, str]] = []
    for turn, user in enumerate(prompt.turns):
        history.append({"role": "user", "content": user})
        answers = [
            client.chat(
                list(history) if turn else user,
                max_tokens=max_new_tokens,
                sampling=sampling,
                think=think,
            )
            for _ in range(repeats)
        ]
        first = answers[0]
        served = first.stats
        stats = GenStats(
            new_tokens=first.tokens,
            steps=(served.steps or 0) if served else 0,
            accepted=(served.accepted or 0) if served else 0,
            verified=(served.drafted or 0) if served else 0,
            seconds=first.seconds,
            ttft_seconds=first.ttft_seconds,
            finish_reason=first.finish_reason,
            method=name,
        )
        ttfts = [a.ttft_seconds for a in answers if a.ttft_seconds is not None]
        runs.append(PromptRun(
            method=name,
            category=prompt.category,
            prompt=index,
            tokens=list(first.token_ids or []),
            seconds=statistics.median(a.seconds for a in answers),
            ttft_seconds=statistics.median(ttfts) if ttfts else 0.0,
            stats=stats,
            text=first.text,
            remote=True,
            served=served,
            turn=turn,
        ))  # fmt: skip
        history.append({"role": "assistant", "content": first.text})
    return runs


def _compare(
    result: BenchRun,
    ar: Pipeline | None,
    baseline: str,
    prompt: BenchPrompt,
    index: int,
    turn: int,
    answers: dict[str, PromptRun],
) -> None:
    """Each answer against the baseline's (AR's) to the same turn. Where a local AR ran,
    a divergence's position is in its tokens and its margin is the target's there."""
    if baseline not in answers:
        return
    base = answers[baseline]
    want = base.tokens
    for name, run in answers.items():
        if name == baseline:
            continue
        result.compared[name] = result.compared.get(name, 0) + 1
        by_tokens = bool(run.tokens and want) or not (run.remote or base.remote)
        if (run.tokens == want) if by_tokens else (run.text == base.text):
            result.identical[name] = result.identical.get(name, 0) + 1
            continue
        if ar is None:  # endpoints alone: the first character that differs
            pairs = enumerate(zip(run.text, base.text, strict=False))
            pos = next((j for j, (a, b) in pairs if a != b), min(len(run.text), len(base.text)))
            result.divergences.append(Divergence(name, prompt.category, index, pos, None, turn))
            continue
        if run.remote and not run.tokens:  # no token ids from this server: its text
            pos = _text_divergence(ar, want, run.text)
        else:
            got = run.tokens
            pos = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
            pos = min(len(got), len(want)) if pos is None else pos
        margin = _margin(ar, base.prompt_ids + want[:pos])
        result.divergences.append(Divergence(name, prompt.category, index, pos, margin, turn))


def _text_divergence(ar: Pipeline, want: list[int], got: str) -> int:
    """The first of AR's tokens whose text `got` does not continue with."""
    for j in range(len(want)):
        # a token that ends inside a multi-byte character decodes to U+FFFD until completed
        if not got.startswith(ar.codec.decode(want[: j + 1]).rstrip("\ufffd")):
            return j
    return len(want)


@torch.inference_mode()
def _margin(ar: Pipeline, context: list[int]) -> float:
    """The target's top-1 minus top-2 logit for the token after `context`."""
    model = ar.model
    cache = model.new_cache(len(context) + 1)
    logits = model(torch.tensor([context], device=model.device), cache, num_logits=1).logits
    top = torch.topk(logits[0, -1].float(), 2).values
    return float(top[0] - top[1])


def _memory(pipe: Pipeline | TransformersBaseline) -> int:
    """Peak device memory on CUDA; on the CPU the bytes this method keeps resident (target
    weights, its KV cache (and recurrent state), drafter weights and context caches)."""
    if pipe.model.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(pipe.model.device))
    if isinstance(pipe, TransformersBaseline):
        return pipe.memory_bytes()
    tensors = [*pipe.model.tensors(), *pipe.session.cache.tensors()]
    if pipe.session.drafter is not None:
        tensors += pipe.session.drafter.tensors()
    tensors = list({t.data_ptr(): t for t in tensors}.values())  # shared storage once
    return sum(t.numel() * t.element_size() for t in tensors)
