"""Measured step costs: how long the target takes to verify n draft tokens (n = 0..k).

Costs depend on the context length too (attention over the cache grows with it, faster
for a multi-token block than for one token), so they are measured after two context
lengths and interpolated linearly in between (extrapolated beyond). Profiled once per
(model, dtype, device, threads, torch) and cached as JSON under $SPECGEN_HOME/costs/, so
later runs (and seeded sampling runs, whose verify lengths depend on these numbers) reuse
the same table. Timings never enter tests; they only steer the verify length, which does
not change which tokens come out.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specgen.models.transformer import Transformer
from specgen.paths import specgen_home

PROFILE_CONTEXTS = (128, 1024)  # cached tokens behind the measured blocks


@dataclass(frozen=True)
class CostTable:
    contexts: tuple[int, ...]  # increasing context lengths that were measured
    seconds: tuple[tuple[float, ...], ...]  # [c][n]: a forward over n + 1 tokens at contexts[c]

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


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(
    model: Transformer,
    max_drafts: int,
    *,
    contexts: tuple[int, ...] = PROFILE_CONTEXTS,
    repeats: int = 5,
) -> CostTable:
    """Time target forwards over blocks of 1..max_drafts+1 tokens after each context.

    Sizes are interleaved across sweeps and each keeps its fastest run: on a shared machine
    interference only ever adds time.
    """
    device, vocab = model.device, model.args.vocab_size
    contexts = tuple(c for c in contexts if c + max_drafts + 1 <= model.args.max_positions)
    gen = torch.Generator().manual_seed(0)
    table = []
    for context in contexts or (1,):
        cache = model.new_cache(context + max_drafts + 1)
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
                model(block, cache)
                _sync(device)
                if sweep:
                    seconds[n] = min(seconds[n], time.perf_counter() - start)
                cache.rollback(context)
        table.append(tuple(seconds))
    return CostTable(contexts or (1,), tuple(table))


def cached_costs(
    model: Transformer,
    key: str,
    max_drafts: int,
    notify: Callable[[str], None] | None = None,
) -> CostTable:
    """The cost table for `key` (model identity + dtype + device), measuring it once."""
    threads = torch.get_num_threads()
    ident = f"{key}|{model.dtype}|{model.device}|threads={threads}|torch={torch.__version__}"
    path = specgen_home() / "costs" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")
    try:
        data = json.loads(path.read_text())
        table = CostTable(tuple(data["contexts"]), tuple(tuple(s) for s in data["seconds"]))
        if table.max_drafts >= max_drafts:
            return table
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or from an older format: measure again
    if notify:
        notify("measuring verify costs once for this model and device (cached)")
    table = measure_costs(model, max_drafts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    record = {"key": ident, "contexts": table.contexts, "seconds": table.seconds}
    tmp.write_text(json.dumps(record))
    tmp.replace(path)
    return table
