"""The `specgen` command: a thin Typer app. Commands parse, call the API, and render."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from specgen.cli.bench import bench
from specgen.cli.calibrate import calibrate
from specgen.cli.chat import chat
from specgen.cli.export import export
from specgen.cli.generate import generate
from specgen.cli.models import models, pull
from specgen.cli.serve import serve
from specgen.cli.train import train

app = typer.Typer(
    name="specgen",
    help="Lossless speculative decoding for local LLMs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def version() -> str:
    """The installed package's version (from its metadata, so it cannot drift from it)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("specgen")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def _print_version(value: bool) -> None:
    if value:
        from specgen.terminal import display

        display.write(f"specgen {version()}\n")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print specgen's version and exit.",
        ),
    ] = False,
) -> None:
    """Lossless speculative decoding for local LLMs."""


app.command()(generate)
app.command()(chat)
app.command()(models)
app.command()(pull)
app.command()(bench)
app.command()(calibrate)
app.command()(export)
app.command()(serve)
app.command()(train)


def main() -> None:
    """The `specgen` command. Once a command is done and its output flushed, the process
    ends without the interpreter's teardown, which costs half a second of CPU once torch
    is loaded (every cache and file is written and closed by then). Under a profiler or a
    coverage tracer it ends normally, so that they can write their results."""
    try:
        app()
        code = 0
    except SystemExit as e:  # how Typer ends every command
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
            pass
    os._exit(code)
