"""Pricing a step that several answers share (engine/batch.py), so each answer's scheduler
decides whether its drafts pay for the whole batch, not for itself alone.

An answer alone drafts k tokens when its expected tokens E(k) = 1 + a_1 + ... + a_k per
step beat a plain step in tokens per second: E(k) / S(1 + k) > 1 / S(1), S(n) the time of
a forward over n rows. In a batch the step's time T is shared by the m answers that get
a token from it, and k extra rows make it longer by X(k) for every one of them; they pay
when the tokens they add per second added beat the batch's own rate:
(E(k) - 1) / X(k) > m / T. Each scheduler keeps its one rule if it is handed the prices

    P(n) = T / m + X(n)    (n = 0..its longest verify)

since E(k) / P(k) > 1 / P(0) is exactly the batch's rule. With one answer (T = S(1),
m = 1) P(n) = S(1 + n): today's scheduler, to the bit. What X and T are depends on how
the forwards run (`RowCosts`): each answer its own forward (the costs add up) or all rows
in one forward (priced by the batch's rows, from costs measured per batch size).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from specgen.scheduling.cost import CostTable

# (tokens of context, rows) of one answer's part of a step
Part = tuple[int, int]


def rows_seconds(table: CostTable, context: int, rows: int) -> float:
    """A forward over `rows` rows of one answer after `context` tokens: the table's price,
    extended in a line past its longest verify (a prefill chunk)."""
    steps = table.step_seconds(context)
    if rows <= len(steps):
        return steps[max(rows, 1) - 1]
    slope = steps[-1] - steps[-2] if len(steps) > 1 else steps[-1]
    return steps[-1] + slope * (rows - len(steps))


class RowCosts(Protocol):
    """What a step of several answers' rows costs."""

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float: ...


class SeparateForwards:
    """Each answer's rows are a forward of its own: the step costs their sum."""

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float:
        return sum(rows_seconds(table, context, rows) for context, rows in parts)


@dataclass(frozen=True)
class OneForward:
    """Every answer's rows in one forward: its products read each weight once for all
    rows, so the step costs what a forward of that many rows costs (`by_rows[r - 1]`,
    measured per batch size), plus each answer's attention over its own context, priced
    as the table's plain step at that context less at the shortest one measured."""

    by_rows: tuple[float, ...]  # seconds of a forward over r rows, at the shortest context

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float:
        rows = sum(r for _, r in parts)
        if rows <= 0:
            return 0.0
        base = self.by_rows
        if rows <= len(base):
            product = base[rows - 1]
        else:
            slope = base[-1] - base[-2] if len(base) > 1 else base[-1]
            product = base[-1] + slope * (rows - len(base))
        shortest = table.step_seconds(table.contexts[0])[0]
        attention = sum(max(0.0, table.step_seconds(c)[0] - shortest) * r for c, r in parts)
        return product + attention


def batch_prices(
    table: CostTable,
    costs: RowCosts,
    context: int,
    others: Sequence[Part],
    producing: int,
) -> list[float]:
    """The prices P(n), n = 0..table.max_drafts, that one answer's scheduler decides by
    when it shares the step with `others` (their parts as planned so far), `producing` of
    which get a token from it (decoding, not prefilling). See the module."""
    if not others:  # alone: the table's own prices (not a sum that rounds differently)
        return table.step_seconds(context)
    plain = costs.seconds(table, [*others, (context, 1)])
    share = plain / (producing + 1)
    return [
        share + costs.seconds(table, [*others, (context, 1 + n)]) - plain
        for n in range(table.max_drafts + 1)
    ]
