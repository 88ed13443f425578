"""Measured step costs: how long the target takes to verify n draft tokens (n = 0..k), and
how long the drafter takes to propose k tokens (k = 1..its longest draft: a block drafter
runs its backbone over the whole block either way, but computes LM-head rows, and DSpark
Markov draws, only for the tokens it returns).

Costs depend on the context length too (attention over the cache grows with it, faster
for a multi-token block than for one token), so they are measured after two context
lengths and interpolated linearly in between (extrapolated beyond). The drafter's time per
step (observe a few committed tokens, then propose) is measured once per drafter. Both are
profiled once per (model, drafter, dtype, device, threads, torch) and cached as JSON under
$SPECGEN_HOME/costs/, so later runs (and seeded sampling runs, whose verify lengths depend
on these numbers) reuse them. Timings never enter tests; they only steer the verify
length, which does not change which tokens come out.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch

from specgen.models.transformer import Transformer
from specgen.paths import specgen_home

if TYPE_CHECKING:
    from specgen.drafting.base import DraftMethod

PROFILE_CONTEXTS = (128, 1024)  # cached tokens behind the measured blocks


@dataclass(frozen=True)
class CostTable:
    contexts: tuple[int, ...]  # increasing context lengths that were measured
    seconds: tuple[tuple[float, ...], ...]  # [c][n]: a forward over n + 1 tokens at contexts[c]
    draft_seconds: float = 0.0  # the drafter's time per step drafting its longest draft
    draft_by_length: tuple[float, ...] = ()  # [k - 1]: drafting k tokens (empty: the above)

    def draft_cost(self, k: int) -> float:
        """The drafter's time to draft k tokens."""
        return draft_time(self.draft_seconds, self.draft_by_length, k)

    @property
    def max_drafts(self) -> int:
        return len(self.seconds[0]) - 1

    def step_seconds(self, context: int) -> list[float]:
        """Costs for n = 0..max_drafts at this context length (linear in the context)."""
        if len(self.contexts) == 1:
            return list(self.seconds[0])
        i = 1
        while i < len(self.contexts) - 1 and context > self.contexts[i]:
            i += 1
        (c0, c1), (s0, s1) = self.contexts[i - 1 : i + 1], self.seconds[i - 1 : i + 1]
        w = (context - c0) / (c1 - c0)
        return [max(a + w * (b - a), 1e-9) for a, b in zip(s0, s1, strict=True)]


def draft_time(full: float, by_length: Sequence[float], k: int) -> float:
    """A drafter's time to draft k tokens: as measured for k where it was measured per
    length (a block drafter computes LM-head rows only for the tokens it returns), else
    `full`, its time for its longest draft."""
    if not by_length or k <= 0:
        return full
    return by_length[min(k, len(by_length)) - 1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(
    model: Transformer,
    max_drafts: int,
    *,
    contexts: tuple[int, ...] = PROFILE_CONTEXTS,
    repeats: int = 5,
    graphs: bool = False,
) -> CostTable:
    """Time target forwards over blocks of 1..max_drafts+1 tokens after each context.

    Sizes are interleaved across sweeps and each keeps its fastest run: on a shared machine
    interference only ever adds time. `graphs` (CUDA): each block replayed as the CUDA graph
    a session decodes with, so verify costs are on the same footing as the drafter's step,
    whose graphs `measure_draft_seconds` already replays; eager launch overhead would make
    every verify length look alike and drafting look cheaper than it is.
    """
    from specgen.engine.cuda_graphs import GraphedForward

    device, vocab = model.device, model.args.vocab_size
    contexts = tuple(c for c in contexts if c + max_drafts + 1 <= model.args.max_positions)
    gen = torch.Generator().manual_seed(0)
    table = []
    for context in contexts or (1,):
        cache = model.new_cache(context + max_drafts + 1)
        forward = model
        if graphs and device.type == "cuda":
            forward = GraphedForward(model, cache, max_tokens=max_drafts + 1, capture=True)
        model(torch.randint(0, vocab, (1, context), generator=gen).to(device), cache)
        blocks = [
            torch.randint(0, vocab, (1, n + 1), generator=gen).to(device)
            for n in range(max_drafts + 1)
        ]
        seconds = [float("inf")] * (max_drafts + 1)
        for sweep in range(repeats + 1):  # the first sweep warms up
            for n, block in enumerate(blocks):
                _sync(device)
                start = time.perf_counter()
                forward(block, cache)
                _sync(device)
                if sweep:
                    seconds[n] = min(seconds[n], time.perf_counter() - start)
                cache.rollback(context)
        table.append(tuple(seconds))
    return CostTable(contexts or (1,), tuple(table))


def measure_draft_seconds(
    method: DraftMethod, model: Transformer, *, context: int = 128, repeats: int = 5
) -> tuple[float, ...]:
    """A drafter's time per step after `context` tokens, for each draft length k = 1..its
    longest ([k - 1]): observe the anchor and two accepted tokens, propose k tokens (a
    drafter may defer its observing work to here), and roll back: what a drafting step
    costs. Greedy; lengths interleaved across sweeps, each keeping its fastest run."""
    from specgen.config import SamplingParams

    device, vocab = model.device, model.args.vocab_size
    gen = torch.Generator().manual_seed(1)
    drafter = method.new_drafter(context + 8)
    cache = model.new_cache(context + 8)
    ids = torch.randint(0, vocab, (1, context + 3), generator=gen).to(device)
    out = model(ids, cache, taps=drafter.taps)
    drafter.observe(ids[0, :context].tolist(), {i: h[:, :context] for i, h in out.taps.items()})
    step = {i: h[:, context:] for i, h in out.taps.items()}
    anchor, params = int(ids[0, context]), SamplingParams()
    best = [float("inf")] * method.max_draft_tokens
    for attempt in range(repeats + 1):  # the first warms up
        for k in range(1, method.max_draft_tokens + 1):
            _sync(device)
            start = time.perf_counter()
            drafter.observe(ids[0, context:].tolist(), step)
            drafter.propose(anchor, k, params, None)
            _sync(device)
            if attempt:
                best[k - 1] = min(best[k - 1], time.perf_counter() - start)
            drafter.rollback(context)
    return tuple(best)


def _cache_path(ident: str):
    return specgen_home() / "costs" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")


def _write_json(path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


# Bumped whenever a kernel's speed changes on purpose, so cached costs are measured again
# (2: few-row CPU matmul paths retuned, draft vocabularies through them; 3: the Markov
# draw spread over the GPU, eager CUDA attention without cuDNN; 4: DSpark's Markov rows for
# its draft vocabulary gathered once, not per slot; drafts timed per length).
KERNELS_REVISION = 4


def cached_costs(
    model: Transformer,
    key: str,
    max_drafts: int,
    notify: Callable[[str], None] | None = None,
    *,
    method: DraftMethod | None = None,
    drafter_key: str = "",
    graphs: bool = False,
) -> CostTable:
    """The cost table for `key` (model identity), measuring what is missing once.

    With `method`, the table also carries that drafter's time per step (cached under
    `drafter_key`, which must identify the drafter and its settings). `graphs`: the
    session decodes with CUDA graphs, so the verify steps are timed as graph replays."""
    threads = torch.get_num_threads()
    graphs = graphs and model.device.type == "cuda"
    ident = (
        f"{key}|{model.dtype}|{model.device}|threads={threads}|torch={torch.__version__}"
        f"|kernels={KERNELS_REVISION}" + ("|graphs" if graphs else "")
    )
    table = _load_table(_cache_path(ident), max_drafts)
    if table is None:
        if notify:
            notify("measuring verify costs once for this model and device (cached)")
        table = measure_costs(model, max_drafts, graphs=graphs)
        record = {"key": ident, "contexts": table.contexts, "seconds": table.seconds}
        _write_json(_cache_path(ident), record)
    if method is None:
        return table
    draft_ident = f"{ident}|drafter={drafter_key}"
    path = _cache_path(draft_ident)
    try:
        by_length = tuple(float(s) for s in json.loads(path.read_text())["by_length"])
        if len(by_length) < method.max_draft_tokens:
            raise ValueError("measured for shorter drafts")
    except (OSError, ValueError, KeyError, TypeError):
        if notify:
            notify("measuring the drafter's cost once (cached)")
        by_length = measure_draft_seconds(method, model)
        _write_json(path, {"key": draft_ident, "by_length": by_length})
    by_length = by_length[: method.max_draft_tokens]
    return replace(table, draft_seconds=by_length[-1], draft_by_length=by_length)


def _load_table(path, max_drafts: int) -> CostTable | None:
    try:
        data = json.loads(path.read_text())
        table = CostTable(tuple(data["contexts"]), tuple(tuple(s) for s in data["seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None  # absent, unreadable or from an older format: measure again
    return table if table.max_drafts >= max_drafts else None
