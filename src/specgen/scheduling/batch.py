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

from specgen.scheduling.cost import CostTable, rising

# (tokens of context, rows) of one answer's part of a step
Part = tuple[int, int]


def rows_seconds(table: CostTable, context: int, rows: int) -> float:
    """A forward over `rows` rows of one answer after `context` tokens: the table's price,
    extended in a line past its longest verify (a prefill chunk)."""
    return _on_a_line(table.step_seconds(context), max(rows, 1))


class RowCosts(Protocol):
    """What a step of several answers' rows costs."""

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float: ...

    def growing(
        self, table: CostTable, others: Sequence[Part], context: int, most: int
    ) -> list[float]:
        """`seconds` of `others` with one more answer after `context` of 1 + n rows, for
        n = 0..most (what every answer's scheduler is priced by, every step: worked out
        once for the others, not per n)."""
        ...


class SeparateForwards:
    """Each answer's rows are a forward of its own: the step costs their sum."""

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float:
        return sum(rows_seconds(table, context, rows) for context, rows in parts)

    def growing(
        self, table: CostTable, others: Sequence[Part], context: int, most: int
    ) -> list[float]:
        base = self.seconds(table, others)
        own = table.step_seconds(context)
        return [base + _on_a_line(own, 1 + n) for n in range(most + 1)]


@dataclass(frozen=True)
class OneForward:
    """Every answer's rows in one forward: its products read each weight once for all
    rows, so the step costs what a forward of that many rows costs, plus each answer's
    attention over its own context (priced as the table's plain step at that context less
    at the shortest one measured). The cost by rows is `by_rows[r - 1]`, or, when not
    given, the table's own: its verify of r - 1 drafts is a forward of r rows (measured
    per batch size as steps run), extended in a line past its longest."""

    by_rows: tuple[float, ...] | None = None  # seconds of a forward over r rows

    def seconds(self, table: CostTable, parts: Sequence[Part]) -> float:
        rows = sum(r for _, r in parts)
        if rows <= 0:
            return 0.0
        shortest = table.contexts[0]
        if self.by_rows is None:
            product = rows_seconds(table, shortest, rows)
        else:
            product = _on_a_line(self.by_rows, rows)
        return product + self._attention(table, parts)

    def growing(
        self, table: CostTable, others: Sequence[Part], context: int, most: int
    ) -> list[float]:
        rows = sum(r for _, r in others)
        by_rows = self.by_rows or table.step_seconds(table.contexts[0])
        attention = self._attention(table, others)
        mine = self._attention(table, [(context, 1)])
        return [_on_a_line(by_rows, rows + 1 + n) + attention + mine * (1 + n)
                for n in range(most + 1)]  # fmt: skip

    @staticmethod
    def _attention(table: CostTable, parts: Sequence[Part]) -> float:
        """Each answer's attention over its own context: the table's plain step there
        less at the shortest context measured, per row."""
        plain = table.step_second(table.contexts[0], 0)
        return sum(max(0.0, table.step_second(c, 0) - plain) * r for c, r in parts)


def _on_a_line(by_rows: Sequence[float], rows: int) -> float:
    """A forward over `rows` rows: never cheaper than one over fewer (`rising`), and past
    the table on a line of its mean cost per row. The last two entries' difference, the
    slope once taken, was noise as often as not: corrected by what steps showed on a busy
    server, a table's last two rows once fell by 0.8 ms, rows past it priced as free, and
    ngram at 8 answers verified five times the drafts and ran at 0.8x AR."""
    priced = rising(by_rows)
    if rows <= len(priced):
        return priced[rows - 1]
    if len(priced) < 2:
        return priced[-1] * rows
    slope = (priced[-1] - priced[0]) / (len(priced) - 1)
    return priced[-1] + slope * (rows - len(priced))


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
    steps = costs.growing(table, others, context, table.max_drafts)
    share = steps[0] / (producing + 1)
    return [share + step - steps[0] for step in steps]
