"""Keeping the keyboard out of an answer while it streams (`specgen chat` on a terminal).

A terminal echoes keys as they are typed, into the middle of the streaming answer, and
the live view then redraws over those half lines. `typing_held` turns echo and line
editing off on a TTY stdin while an answer streams (signals stay on, so Ctrl-C still
stops the answer) and restores the settings afterwards, on Ctrl-C and errors too.

What was typed meanwhile is discarded, not kept for the next prompt: it was never shown,
so it would sit invisible in the next input line and be sent by the next Enter as words
the user never saw on the screen.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

try:
    import termios
except ImportError:  # Windows: no termios; typing then echoes as it always did
    termios = None  # type: ignore[assignment]


def tty_fd(stream: TextIO) -> int | None:
    """`stream`'s file descriptor if it is a terminal (None for pipes, files, test doubles)."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.StringIO, a closed stream
        return None
    return fd if os.isatty(fd) else None


@contextmanager
def typing_held(stream: TextIO | None = None) -> Iterator[None]:
    """While inside: keys typed on the terminal `stream` (default stdin) are not echoed;
    on leaving, the terminal is as before and the keys typed meanwhile are dropped."""
    fd = tty_fd(sys.stdin if stream is None else stream)
    if fd is None or termios is None:
        yield
        return
    saved = termios.tcgetattr(fd)
    held = list(saved)
    held[3] = saved[3] & ~(termios.ECHO | termios.ICANON)  # lflag; ISIG stays: Ctrl-C works
    termios.tcsetattr(fd, termios.TCSANOW, held)
    try:
        yield
    finally:
        # TCSAFLUSH restores the settings and drops unread input in one step (see above)
        termios.tcsetattr(fd, termios.TCSAFLUSH, saved)
