"""The CLI in a fresh interpreter, as a user starts it, saying which heavy libraries it
imported: what decides how fast a command starts (tests never time it)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

HEAVY = ("torch", "transformers", "triton", "huggingface_hub", "rich")

# `python -m specgen ARGS`, then (at exit, whatever the exit status, and however it
# exits: the CLI ends with os._exit) the heavy modules it imported, as stdout's last line
_WRAPPER = (
    "import atexit, os, runpy, sys\n"
    f"heavy = {HEAVY!r}\n"
    "say = lambda: print('imported:', [m for m in heavy if m in sys.modules], flush=True)\n"
    "atexit.register(say)\n"
    "real_exit = os._exit\n"
    "os._exit = lambda code: (say(), real_exit(code))\n"
    "sys.argv = ['specgen', *sys.argv[1:]]\n"
    "runpy.run_module('specgen', run_name='__main__', alter_sys=True)\n"
)


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 600):
    """`specgen ARGS` in a new process; stdout ends with `imported: [...]`."""
    full = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", _WRAPPER, *args],
        capture_output=True, text=True, timeout=timeout, env=full,
    )  # fmt: skip


def imported(done) -> list[str]:
    """The heavy modules the process imported (from its last line of stdout)."""
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("imported: "), done.stdout
    return ast.literal_eval(last.removeprefix("imported: "))
