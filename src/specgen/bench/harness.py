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
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specgen.bench.modeled import prices_of
from specgen.bench.suites import BenchPrompt
from specgen.bench.transformers_baseline import TransformersBaseline
from specgen.config import SamplingParams
from specgen.engine.session import Session
from specgen.pipeline import Pipeline
from specgen.scheduling.cost import modeled
from specgen.stats import GenStats

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


@dataclass
class Divergence:
    method: str
    category: str
    prompt: int
    position: int  # first answer token that differs from AR's
    margin: float  # the target's top-1 minus top-2 logit there (AR's context)


@dataclass
class BenchRun:
    runs: list[PromptRun] = field(default_factory=list)
    divergences: list[Divergence] = field(default_factory=list)
    compared: dict[str, int] = field(default_factory=dict)  # greedy answers compared with AR
    identical: dict[str, int] = field(default_factory=dict)
    memory_bytes: dict[str, int] = field(default_factory=dict)


def run_bench(
    pipes: dict[str, Pipeline | TransformersBaseline],
    prompts: list[BenchPrompt],
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int = 1,
    progress: Progress | None = None,
) -> BenchRun:
    """Run every pipeline on every prompt. `pipes` must contain "ar" (a Pipeline); "hf" may
    be transformers' own generate on the same checkpoint."""
    if not isinstance(pipes.get("ar"), Pipeline):
        raise ValueError("the benchmark needs the AR baseline")
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    result = BenchRun()
    names = list(pipes)
    ar = pipes["ar"]
    assert isinstance(ar, Pipeline)
    fresh = _FreshSessions()
    prices = prices_of(p.costs for p in pipes.values() if isinstance(p, Pipeline))
    for name in names:  # warm-up: first-call allocations, kernel selection, caches
        pipe = pipes[name]
        if isinstance(pipe, TransformersBaseline):
            pipe.run(ar.encode("Hello"), 8, sampling)
        else:
            pipe.generate("Hello", max_new_tokens=8, session=fresh(pipe))
    ids = [ar.encode(p.text) for p in prompts]
    for i, prompt in enumerate(prompts):
        order = names if i % 2 == 0 else names[::-1]
        answers: dict[str, list[int]] = {}
        for name in order:
            run = _run_one(
                pipes[name], name, prompt, i, ids[i], max_new_tokens, sampling, repeats, fresh
            )
            if prices is not None and run.stats.shapes:
                run.modeled = modeled(run.stats.shapes, prices)
            result.runs.append(run)
            answers[name] = run.tokens
            result.memory_bytes[name] = max(result.memory_bytes.get(name, 0), _memory(pipes[name]))
            if progress:
                progress(f"{name} · {prompt.category} {i + 1}/{len(prompts)}")
        if sampling.greedy:
            _compare(result, ar, prompt, i, ids[i], answers)
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
    ids: list[int],
    max_new_tokens: int,
    sampling: SamplingParams,
    repeats: int,
    fresh: _FreshSessions,
) -> PromptRun:
    times, ttfts, first = [], [], None
    for _ in range(repeats):
        if pipe.model.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pipe.model.device)
        tokens: list[int] = []
        stats = GenStats()
        if isinstance(pipe, TransformersBaseline):
            tokens, stats = pipe.run(ids, max_new_tokens, sampling)
        else:
            chunks = pipe.stream_ids(
                ids, sampling=sampling, max_new_tokens=max_new_tokens, session=fresh(pipe)
            )
            for chunk in chunks:
                tokens.extend(chunk.token_ids)
                stats = chunk.stats
        times.append(stats.seconds)
        ttfts.append(stats.ttft_seconds or 0.0)
        if first is None:
            first = (tokens, stats)
    assert first is not None
    return PromptRun(
        method=name,
        category=prompt.category,
        prompt=index,
        tokens=first[0],
        seconds=statistics.median(times),
        ttft_seconds=statistics.median(ttfts),
        stats=first[1],
    )


def _compare(
    result: BenchRun,
    ar: Pipeline,
    prompt: BenchPrompt,
    index: int,
    ids: list[int],
    answers: dict[str, list[int]],
) -> None:
    want = answers["ar"]
    for name, got in answers.items():
        if name == "ar":
            continue
        result.compared[name] = result.compared.get(name, 0) + 1
        if got == want:
            result.identical[name] = result.identical.get(name, 0) + 1
            continue
        pos = next((j for j, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), None)
        pos = min(len(got), len(want)) if pos is None else pos
        margin = _margin(ar, ids + want[:pos])
        result.divergences.append(Divergence(name, prompt.category, index, pos, margin))


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
    tensors = [*pipe.model.parameters(), *pipe.session.cache.tensors()]
    if pipe.session.drafter is not None:
        tensors += pipe.session.drafter.tensors()
    tensors = list({t.data_ptr(): t for t in tensors}.values())  # shared storage once
    return sum(t.numel() * t.element_size() for t in tensors)
