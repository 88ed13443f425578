"""The `specgen` command: a thin Typer app. Commands parse, call the API, and render."""

from __future__ import annotations

import typer

from specgen.cli.bench import bench
from specgen.cli.calibrate import calibrate
from specgen.cli.chat import chat
from specgen.cli.export import export
from specgen.cli.generate import generate
from specgen.cli.models import models, pull
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
app.command()(generate)
app.command()(chat)
app.command()(models)
app.command()(pull)
app.command()(bench)
app.command()(calibrate)
app.command()(export)
app.command()(train)


def main() -> None:
    app()
