"""Where `specgen generate` gets its prompts: an argument, a file, or stdin.

Files are read as bytes and decoded line by line so a bad byte is reported with its line
number instead of a UnicodeDecodeError traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import BinaryIO

from specgen.errors import PromptError


def read_prompt_file(path: str, stdin: BinaryIO | None = None) -> list[str]:
    """Prompts from a `.txt` (one per line) or `.jsonl` (`prompt` or `turns[0]`) file.

    `-` reads the lines of stdin. Blank lines are skipped.
    """
    if path == "-":
        data, label, jsonl = (stdin or sys.stdin.buffer).read(), "stdin", False
    else:
        file = Path(path)
        if not file.is_file():
            raise PromptError(f"{path}: no such prompt file")
        data, label, jsonl = file.read_bytes(), path, file.suffix == ".jsonl"
    prompts = []
    for number, raw in enumerate(data.splitlines(), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise PromptError(f"{label}: line {number} is not valid UTF-8") from None
        if not line.strip():
            continue
        prompts.append(_from_jsonl(line, label, number) if jsonl else line)
    if not prompts:
        raise PromptError(f"{label}: no prompts in it")
    return prompts


def _from_jsonl(line: str, label: str, number: int) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise PromptError(f"{label}: line {number} is not valid JSON ({e.msg})") from None
    if isinstance(record, dict):
        if isinstance(record.get("prompt"), str):
            return record["prompt"]
        turns = record.get("turns")
        if isinstance(turns, list) and turns and isinstance(turns[0], str):
            return turns[0]
    raise PromptError(f"{label}: line {number} has neither a 'prompt' string nor 'turns'")


def read_stdin_prompt(stdin: BinaryIO | None = None) -> str:
    """All of stdin as one prompt (so `cat article.txt | specgen generate` works)."""
    stream = stdin or sys.stdin.buffer
    data = stream.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptError(f"stdin is not valid UTF-8 (bad byte at offset {e.start})") from None
    if not text.strip():
        raise PromptError(
            "stdin is empty: give a prompt argument, --prompt-file FILE, or pipe text in"
        )
    return text.strip()
