"""Modeled decoding time: each step of a run priced from the measured cost table instead of
read off the wall clock (`scheduling.cost.modeled`), with one price list for a bench.

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

from collections.abc import Iterable

from specgen.scheduling.cost import CostTable


def prices_of(tables: Iterable[CostTable | None]) -> CostTable | None:
    """One price list for a bench's pipelines: the first cost table's target forwards, and
    each drafter's draft times from the first table that prices it. None without tables."""
    found = [t for t in tables if t is not None]
    if not found:
        return None
    drafts: dict[str, tuple[float, ...]] = {}
    for table in found:
        for name, by_length in table.drafts.items():
            drafts.setdefault(name, by_length)
    return CostTable(found[0].contexts, found[0].seconds, drafts)
