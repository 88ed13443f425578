"""The live view: the answer streaming with a status panel under it (chat and generate on a
terminal).

`status_panel` is a pure function of the stats (tested without a terminal). `LiveAnswer`
prints finished lines of the answer above a small Rich Live region holding the unfinished
line and the panel; Rich redraws that region from its own thread 4 times a second, so
the decoding loop only appends text (benchmarks/live_view_overhead.py measures the cost).
With `show_drafts`, text from accepted draft tokens is coloured apart from the target's
own (bonus) tokens. `PlainAnswer` is the same interface for pipes: just the text.

The speedup over AR that the panel shows is modeled, never measured against a clock:
`modeled_speedup` (scheduling/speedup.py, which the server's stats use too) prices the
answer's steps and AR's for the same tokens from one cost table, so a table measured on a
busy machine does not inflate it.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Protocol

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
from rich.text import Text

from specgen.core.stats import GenStats
from specgen.scheduling.cost import CostTable
from specgen.scheduling.speedup import ModeledSpeedup
from specgen.terminal.display import drafter_shares, plural

if TYPE_CHECKING:
    from specgen.api.pipeline import Chunk, Pipeline

BARS = "▁▂▃▄▅▆▇█"
DRAFT_STYLE = "cyan"


def acceptance_bars(rates: list[float]) -> str:
    """One bar per draft position, height = acceptance rate (a tiny bar chart)."""
    return "".join(BARS[min(int(r * len(BARS)), len(BARS) - 1)] for r in rates)


def speedup_text(speedup: float) -> str:
    """How a modeled speedup is shown: said to be modeled, not measured."""
    return f"speedup vs AR ≈ {speedup:.2f}x (modeled from step costs)"


def status_panel(stats: GenStats, speedup: float | None = None) -> Panel:
    """What the live view shows under the answer; `speedup`: `modeled_speedup`'s."""
    top = [plural(stats.new_tokens, "token"), f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.verify_policy is not None:
        top += [
            f"τ {stats.acceptance_length:.2f} (incl. bonus)",
            f"verify {stats.mean_verify_length:.2f}/step",
        ]
    if stats.mean_confidence is not None:
        top.append(f"confidence {stats.mean_confidence:.2f}")
    lines = [" · ".join(top)]
    shares = drafter_shares(stats)
    if shares:
        lines.append("drafted by " + " · ".join(shares))
    rates = stats.acceptance_per_position()
    if rates:
        lines.append(f"acceptance by position {acceptance_bars(rates)}")
    if speedup is not None:
        lines.append(speedup_text(speedup))
    return Panel("\n".join(lines), border_style="dim", expand=False)


class AnswerView(Protocol):
    def push(self, chunk: Chunk) -> None: ...

    def close(self, stats: GenStats | None) -> None: ...


class PlainAnswer:
    """Text to stdout as it comes; a stats line on stderr when that is a terminal."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet

    def push(self, chunk: Chunk) -> None:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()

    def close(self, stats: GenStats | None) -> None:
        sys.stdout.write("\n")
        sys.stdout.flush()
        if stats is not None and not self.quiet and sys.stderr.isatty():
            from specgen.terminal import display

            display.show_stats(stats)


class LiveAnswer:
    def __init__(
        self, console: Console, costs: CostTable | None = None, show_drafts: bool = False
    ) -> None:
        self.console = console
        self.costs = costs
        self.meter = None if costs is None else ModeledSpeedup(costs)
        self.show_drafts = show_drafts
        self.line = Text()
        self.stats: GenStats | None = None
        self.lock = threading.Lock()  # the refresh thread reads what push writes
        self.live = Live(
            self, console=console, refresh_per_second=4, transient=True, auto_refresh=True
        )
        self.live.start()

    def speedup(self, stats: GenStats) -> float | None:
        """`modeled_speedup` of the answer so far (only new steps priced at each redraw)."""
        return None if self.meter is None else self.meter.update(stats.shapes)

    def __rich__(self) -> Group:  # called by Live's refresh thread
        with self.lock:
            line, stats = self.line.copy(), self.stats
        if stats is None:
            return Group(line)
        return Group(line, status_panel(stats, self.speedup(stats)))

    def push(self, chunk: Chunk) -> None:
        drafted, own = chunk.text[: chunk.draft_chars], chunk.text[chunk.draft_chars :]
        finished = []
        with self.lock:
            self.stats = chunk.stats
            for piece, style in ((drafted, DRAFT_STYLE if self.show_drafts else ""), (own, "")):
                *done, rest = piece.split("\n")
                for part in done:
                    self.line.append(part, style)
                    finished.append(self.line)
                    self.line = Text()
                self.line.append(rest, style)
        # printed above the live region, for good, wrapped at words as the live region
        # wraps them (one long line left to the terminal splits words at its edge)
        for line in finished:
            self.console.print(line)

    def close(self, stats: GenStats | None) -> None:
        self.live.stop()
        self.console.print(self.line)
        if stats is not None:
            self.console.print(status_panel(stats, self.speedup(stats)))


def answer_view(pipe: Pipeline, *, quiet: bool, show_drafts: bool) -> AnswerView:
    """The live view on a terminal (unless --quiet), plain text otherwise."""
    if quiet or not sys.stdout.isatty():
        return PlainAnswer(quiet)
    return LiveAnswer(Console(highlight=False), pipe.costs, show_drafts)
