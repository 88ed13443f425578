"""Where the server's own lines go: the ready line (stdout), status lines and internal
errors (stderr). `specgen serve` hands in the terminal's renderers (terminal/display.py: Rich, a dim
status, a red "error:"), so the server itself imports no view; a library caller gets the
same lines as plain text."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _status(message: str) -> None:
    sys.stderr.write(message + "\n")


def _error(message: str) -> None:
    sys.stderr.write("error: " + " ".join(message.split()) + "\n")  # one line, always


@dataclass(frozen=True)
class Log:
    write: Callable[[str], None] = _out  # text as is (the ready line brings its newline)
    status: Callable[[str], None] = _status
    error: Callable[[str], None] = _error
