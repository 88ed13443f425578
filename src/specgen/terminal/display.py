"""Everything specgen prints goes through here.

The answer goes to stdout as plain text (so pipes get exactly the model's words); status,
stats and errors go to stderr through Rich, which drops colour when stderr is not a
terminal. Formatting functions are pure (stats in, string or renderable out) so they are
tested without a terminal.
"""

from __future__ import annotations

import copy
import io
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from specgen.core.stats import GenStats

if TYPE_CHECKING:
    from specgen.methods.dspark.calibration import CalibrationFit

_err = Console(stderr=True, highlight=False, soft_wrap=True)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


def write(text: str) -> None:
    """Answer text, streamed: no buffering, no markup."""
    sys.stdout.write(text)
    sys.stdout.flush()


def write_json(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def status(message: str) -> None:
    _err.print(f"[dim]{_escape(message)}[/dim]")


def error(message: str) -> None:
    # One line, always: callers pass messages without newlines, and we make sure of it.
    line = " ".join(message.split())
    _err.print(f"[bold red]error:[/bold red] {_escape(line)}")


def note(message: str) -> None:
    _err.print(f"[yellow]{_escape(message)}[/yellow]")


def plural(n: int, word: str) -> str:
    """`n` and `word`, with an "s" unless n is 1 ("1 step", "2 steps")."""
    return f"{n} {word}" + ("" if n == 1 else "s")


def stats_line(stats: GenStats) -> str:
    """One line summarising a finished generation."""
    parts = [
        plural(stats.new_tokens, "token"),
        f"{stats.tokens_per_second:.1f} tok/s",
        f"τ {stats.acceptance_length:.2f} (incl. bonus)",
    ]
    if stats.verify_policy is not None:
        parts.append(f"verify {stats.mean_verify_length:.2f}/step ({stats.verify_policy})")
    if stats.mean_confidence is not None:
        parts.append(f"confidence {stats.mean_confidence:.2f}")
    parts += drafter_shares(stats)
    if stats.ttft_seconds is not None:
        parts.append(f"first token {stats.ttft_seconds:.2f} s")
    if stats.prompt_tokens:
        cached = stats.prompt_tokens - stats.prefill_tokens
        parts.append(f"prompt {stats.prompt_tokens}" + (f" ({cached} cached)" if cached else ""))
    if stats.finish_reason and stats.finish_reason != "stop":
        parts.append(f"stopped: {stats.finish_reason}")
    return " · ".join(parts)


def drafter_shares(stats: GenStats) -> list[str]:
    """Stacked: how many steps each drafter drafted, and its τ over them."""
    shares = stats.by_drafter.items()
    return [f"{name} {plural(n, 'step')} τ {(a + n) / n:.2f}" for name, (n, a) in shares]


def show_stats(stats: GenStats) -> None:
    _err.print(f"[dim]{_escape(stats_line(stats))}[/dim]")


def models_table(rows: Iterable[dict[str, Any]]) -> Table:
    """`specgen models`: thinking is the chat mode the drafters were trained with."""
    table = Table(title="specgen models", title_justify="left")
    for column in ("alias", "repo", "drafters", "thinking", "status"):
        table.add_column(column)
    for row in rows:
        drafters = ", ".join(f"{d['method']}: {d['repo']}" for d in row["drafters"])
        thinking = {True: "on", False: "off", None: "-"}[row["thinking"]]
        alias = row["alias"] + (" (default)" if row["default"] else "")
        table.add_row(alias, row["repo"], drafters or "-", thinking, row["status"])
    return table


def calibration_table(fit: CalibrationFit) -> Table:
    """Per draft position: samples, fitted temperature, ECE of survival before and after."""
    table = Table(title="confidence calibration (ECE of survival a_j)", title_justify="left")
    for column in ("position", "drafts", "temperature", "ECE before", "ECE after"):
        table.add_column(column, justify="right")
    for j, (n, t, b, a) in enumerate(
        zip(fit.samples, fit.temperatures, fit.ece_before, fit.ece_after, strict=True), start=1
    ):
        table.add_row(str(j), str(n), f"{t:.3f}", f"{b:.4f}", f"{a:.4f}")
    return table


@contextmanager
def progress(total: int, label: str, *, disable: bool = False) -> Iterator[Callable[[str], None]]:
    """A progress bar on stderr; yields `advance(description)` to call after each unit."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=_err,
        transient=True,
        disable=disable,
    )
    with bar:
        task = bar.add_task(label, total=total)

        def advance(description: str) -> None:
            bar.update(task, advance=1, description=f"{label}: {description}")

        yield advance


def show(renderable: Any, *, err: bool = False) -> None:
    """A table or line on stdout (`err`: stderr, where stdout carries JSON alone): Rich on a
    terminal; piped, `plain` text."""
    stream = sys.stderr if err else sys.stdout
    if stream.isatty():
        Console(highlight=False, stderr=err).print(renderable)
    else:
        stream.write(plain(renderable))
        stream.flush()


def plain(renderable: Any) -> str:
    """`renderable` as plain text for pipes and files: no colour, a table without box
    drawing, at its natural width. Rich would otherwise fit it to 80 columns (what it
    assumes without a terminal) and cut the numbers down to `1.00…`."""
    title = None
    if isinstance(renderable, Table):
        renderable = copy.copy(renderable)  # the caller's table keeps its look
        title, renderable.title = renderable.title, None
        renderable.box, renderable.padding, renderable.collapse_padding = None, (0, 1), False
        renderable.pad_edge = False
    console = Console(
        file=io.StringIO(), width=100_000, color_system=None, highlight=False, soft_wrap=True
    )
    with console.capture() as captured:
        if title:
            console.print(title)
        console.print(renderable)
    return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
