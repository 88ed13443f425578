"""Measured step costs: how long the target takes to verify n draft tokens (n = 0..k).

Profiled once per (model, dtype, device, threads, torch) and cached as JSON under
$SPECGEN_HOME/costs/, so later runs (and seeded sampling runs, whose verify lengths depend
on these numbers) reuse the same table. Timings never enter tests; they only steer the
verify length, which does not change which tokens come out.
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

PROFILE_CONTEXT = 128  # cached tokens behind the measured blocks


@dataclass(frozen=True)
class CostTable:
    step_seconds: tuple[float, ...]  # [n]: a target forward over a block of n + 1 tokens

    @property
    def max_drafts(self) -> int:
        return len(self.step_seconds) - 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_costs(model: Transformer, max_drafts: int, *, repeats: int = 5) -> CostTable:
    """Time target forwards over blocks of 1..max_drafts+1 tokens after a short context.

    Each size keeps its fastest run: on a shared machine interference only ever adds time.
    """
    device = model.device
    vocab = model.args.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = model.new_cache(PROFILE_CONTEXT + max_drafts + 1)
    model(torch.randint(0, vocab, (1, PROFILE_CONTEXT), generator=gen).to(device), cache)
    blocks = [
        torch.randint(0, vocab, (1, n + 1), generator=gen).to(device) for n in range(max_drafts + 1)
    ]
    seconds = [float("inf")] * (max_drafts + 1)
    for sweep in range(repeats + 1):  # sweeps interleave the sizes; the first one warms up
        for n, block in enumerate(blocks):
            _sync(device)
            start = time.perf_counter()
            model(block, cache)
            _sync(device)
            if sweep:
                seconds[n] = min(seconds[n], time.perf_counter() - start)
            cache.rollback(PROFILE_CONTEXT)
    return CostTable(tuple(seconds))


def cached_costs(
    model: Transformer,
    key: str,
    max_drafts: int,
    notify: Callable[[str], None] | None = None,
) -> CostTable:
    """The cost table for `key` (model identity + dtype + device), measuring it once."""
    ident = (
        f"{key}|{model.dtype}|{model.device}|threads={torch.get_num_threads()}|{torch.__version__}"
    )
    path = specgen_home() / "costs" / (hashlib.sha256(ident.encode()).hexdigest()[:16] + ".json")
    try:
        table = CostTable(tuple(json.loads(path.read_text())["step_seconds"]))
        if table.max_drafts >= max_drafts:
            return table
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent or unreadable: measure again
    if notify:
        notify("measuring verify costs once for this model and device (cached)")
    table = measure_costs(model, max_drafts)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": ident, "step_seconds": list(table.step_seconds)}))
    tmp.replace(path)
    return table
