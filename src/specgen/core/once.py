"""One-off work, said once: what a first run builds and caches (the CPU kernels, a GGUF's
config and tokenizer, a cost table) is announced in one line with how long it took, so
a slow first answer explains itself and a second run can be seen not to repeat it.

Whoever builds calls `building(what, where)` around the work (or `built(...)` when it
timed the work itself); whoever shows status lines (the CLI, the server) says where the
lines go with `listen(status)`. The builders sit
deep below (the kernel is compiled on first use, inside a forward pass), so the line
travels through this one hook rather than through every call in between; with nobody
listening (library use), nothing is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

Listener = Callable[[str], None]
_listener: list[Listener | None] = [None]  # the one place the lines go (a process's status)


def listen(listener: Listener | None) -> None:
    """Announcements go to `listener` from now on (None: nowhere)."""
    _listener[0] = listener


@contextmanager
def listening(listener: Listener | None) -> Iterator[None]:
    """Announcements made inside go to `listener`; the previous one after."""
    previous = _listener[0]
    _listener[0] = listener
    try:
        yield
    finally:
        _listener[0] = previous


def announce(message: str) -> None:
    """One status line to whoever listens."""
    listener = _listener[0]
    if listener is not None:
        listener(message)


@contextmanager
def building(what: str, where: Path | str | None = None) -> Iterator[None]:
    """Time the one-off work inside and announce it when done: "built the CPU kernels in
    3.1 s, once (cached in ~/.cache/specgen/kernels)". Nothing is said if it fails."""
    start = time.perf_counter()
    yield
    built(what, time.perf_counter() - start, where)


def built(what: str, seconds: float, where: Path | str | None = None) -> None:
    """Announce one-off work that took `seconds` (for work timed by its caller)."""
    cached = f" (cached in {_short(where)})" if where is not None else ""
    announce(f"built {what} in {seconds:.1f} s, once{cached}")


def _short(where: Path | str) -> str:
    path, home = Path(where), Path.home()
    try:
        return "~/" + str(path.relative_to(home))
    except ValueError:
        return str(path)
