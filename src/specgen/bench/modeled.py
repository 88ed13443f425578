"""Modeled decoding time: each step of a run priced from the measured cost table instead of
read off the wall clock.

On a noisy machine a few percent between two methods is lost in run-to-run noise, yet
methods that decide from the same measured costs differ only in what they decide: which
drafter drafts, how many drafts are verified, when nothing is drafted. Pricing every
decoding step after the prefill (the prefill is the same for every method) at

    its drafter's time to draft that many tokens + the target's forward over
    1 + verify length tokens, at the step's context length

from one price list for all methods turns those decisions into a time that is the same
on every rerun, so schedulers can be compared to a fraction of a percent. It is what the
schedulers themselves believe a step costs, so it complements the measured tokens/s and
never replaces it: host work and anything else outside the table do not appear in it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specgen.scheduling.cost import CostTable, draft_time

# GenStats.shapes: context, drafter, tokens drafted, verify length, tokens committed
Shape = tuple[int, str | None, int, int, int]


@dataclass(frozen=True)
class Prices:
    costs: CostTable  # the target's forwards
    # per drafter name: drafting k tokens at [k - 1] (one number: any k)
    draft_seconds: Mapping[str, tuple[float, ...]]


def prices_of(pipes: Mapping[str, Any]) -> Prices | None:
    """One price list for a bench's pipelines: the first cost table among them for the
    target's forwards, and for each drafter the draft time of the first pipeline that
    mounts it (stacked mounts two). None when no pipeline has a cost table."""
    costs: CostTable | None = None
    drafts: dict[str, tuple[float, ...]] = {}
    for pipe in pipes.values():
        table = getattr(pipe, "costs", None)
        if table is None:
            continue
        costs = costs or table
        method = pipe.method
        names = getattr(method, "names", None)  # several drafters, each with its own time
        if names is not None:
            for name, full, by_length in zip(
                names, method.draft_seconds, method.draft_by_length, strict=True
            ):
                drafts.setdefault(name, by_length or (full,))
        else:
            drafts.setdefault(pipe.spec.method, table.draft_by_length or (table.draft_seconds,))
    return None if costs is None else Prices(costs, drafts)


def modeled(shapes: Sequence[Shape], prices: Prices) -> tuple[int, float] | None:
    """(tokens committed, modeled seconds) over these steps; None when a step cannot be
    priced (a drafter without a measured time, or a verify longer than the table)."""
    tokens, seconds = 0, 0.0
    for context, drafter, drafted, verify, committed in shapes:
        row = prices.costs.step_seconds(context)
        if verify >= len(row):
            return None
        seconds += row[verify]
        if drafter is not None:
            if drafter not in prices.draft_seconds:
                return None
            by_length = prices.draft_seconds[drafter]
            seconds += draft_time(by_length[-1], by_length, drafted)
        tokens += committed
    return tokens, seconds
