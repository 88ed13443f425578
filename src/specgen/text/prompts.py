"""Prompt files, read one way for every command (generate, calibrate, train, bench suites).

`.txt`: one prompt per line. `.jsonl`: one JSON object per line, the prompt in `prompt` or
`turns` (Spec-Bench's `question.jsonl` works as is), with an optional `category`. A line
of several `turns` keeps them all (`PromptLine.turns`): `generate` answers them as one
conversation, as `bench --turns all` does; the other commands that measure or train on
prompts take the first. Files are read as bytes and decoded line by line, so a bad byte or
line is reported with its number instead of a traceback. Blank lines are skipped.
`generate` answers a file's good lines and reports each bad one in its place; the commands
that train or measure on a file (calibrate, train, bench) stop at its first bad line.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from specgen.core.errors import PromptError


@dataclass(frozen=True)
class PromptLine:
    text: str
    category: str | None  # a .jsonl line's `category`
    number: int  # its line in the file
    error: str | None = None  # why the line is unusable (read with `keep_bad` only)
    turns: tuple[str, ...] = ()  # a .jsonl line's `turns`, when it has more than one


def read_prompts(
    path: str | Path,
    *,
    what: str = "prompt file",
    jsonl: bool | None = None,
    field: str | None = None,
    stdin: BinaryIO | None = None,
    keep_bad: bool = False,
) -> list[PromptLine]:
    """The prompts of `path` (`-`: the lines of stdin). `jsonl`: read JSON lines (default:
    by the suffix); `field`: the one field a JSON line's prompt is in; `what` names the
    file in messages. A bad line raises `PromptError`, or with `keep_bad` comes back in
    its place with its `error` set (so a caller can answer the good ones and report the
    rest); a file without a single usable line raises either way."""
    if str(path) == "-":
        data, label, jsonl = (stdin or sys.stdin.buffer).read(), "stdin", bool(jsonl)
    else:
        file = Path(path)
        if not file.is_file():
            raise PromptError(f"{path}: no such {what}")
        data, label = file.read_bytes(), str(path)
        jsonl = file.suffix == ".jsonl" if jsonl is None else jsonl
    prompts, bad = [], []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = _parse_line(raw, number, label, jsonl, field)
        except PromptError as e:
            if not keep_bad:
                raise
            line = PromptLine("", None, number, error=str(e))
            bad.append(line)
        if line is not None:
            prompts.append(line)
    if len(prompts) == len(bad):
        if bad:  # nothing to answer: one line now, not one per line after loading a model
            first = bad[0].error.removeprefix(f"{label}: ")
            raise PromptError(f"{label}: no usable prompt in it ({first})")
        raise PromptError(f"{label}: no prompts in it")
    return prompts


def _parse_line(
    raw: bytes, number: int, label: str, jsonl: bool, field: str | None
) -> PromptLine | None:
    """One line of a prompt file (None: blank)."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise PromptError(f"{label}: line {number} is not valid UTF-8") from None
    if not line.strip():
        return None
    if not jsonl:
        return PromptLine(line, None, number)
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{label}: line {number} is not valid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise PromptError(f"{label}: line {number} is not a JSON object")
    text = prompt_text(row, field)
    if text is None:
        expected = repr(field) if field else "'prompt' or 'turns'"
        raise PromptError(f"{label}: line {number} has no prompt text (expected {expected})")
    category = row.get("category")
    turns = row.get("turns") if not field and row.get("prompt") is None else None
    if isinstance(turns, list) and len(turns) > 1:
        if not all(isinstance(t, str) and t.strip() for t in turns):
            raise PromptError(f"{label}: line {number} has a turn that is not text")
        turns = tuple(turns)
    else:
        turns = ()
    return PromptLine(text, None if category is None else str(category), number, turns=turns)


def prompt_text(row: dict, field: str | None = None) -> str | None:
    """A JSON row's prompt: `field`, or `prompt`, or the first of `turns` (None: none)."""
    values = [row.get(field)] if field else [row.get("prompt"), row.get("turns")]
    for value in values:
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, str):
            return value
    return None


def read_stdin_prompt(stdin: BinaryIO | None = None) -> str:
    """All of stdin as one prompt (so `cat article.txt | specgen generate` works)."""
    data = (stdin or sys.stdin.buffer).read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(f"stdin is not valid UTF-8 (bad byte at offset {e.start})") from None
    if not text.strip():
        raise PromptError(
            "stdin is empty: give a prompt argument, --prompt-file FILE, or pipe text in"
        )
    return text.strip()
