"""Prompt suites for `specgen bench`: the built-in one, Spec-Bench-style files, public sets.

- `builtin`: 42 short prompts written for specgen, 7 each of chat, code, math,
  summarization, translation and qa (`suite.jsonl` beside this file).
- A path to a JSONL file with `turns` (a list; the first turn is used, or with `turns="all"`
  every turn as one conversation) or `prompt`, and an optional `category` (Spec-Bench's
  `question.jsonl` works as is; benchmarks/prompts/agent_suite.jsonl is a multi-turn one).
- A named public set fetched from the Hub with huggingface_hub (`PUBLIC`); offline this
  fails with one line.

`--num-prompts N` takes N prompts in total, round-robin over the categories so each is
represented (file order within a category).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specgen.core.errors import PromptError, SpecgenError
from specgen.text.prompts import prompt_text, read_prompts

BUILTIN = "builtin"
BUILTIN_FILE = Path(__file__).with_name("suite.jsonl")


TURNS = ("first", "all")  # --turns: a conversation's first user turn, or all of them


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    text: str  # the (first) user turn
    later: tuple[str, ...] = ()  # the user turns after it: one conversation, answered in turn

    @property
    def turns(self) -> tuple[str, ...]:
        return (self.text, *self.later)


@dataclass(frozen=True)
class PublicSet:
    repo: str  # a Hub dataset
    filename: str
    field: str  # the prompt's column (a string, or a list of turns)
    category: str | None  # the category column, or None for `name` as the category


PUBLIC = {
    "mt-bench": PublicSet(
        "HuggingFaceH4/mt_bench_prompts", "raw/question.jsonl", "prompt", "category"
    ),
    "gsm8k": PublicSet("openai/gsm8k", "main/test-00000-of-00001.parquet", "question", None),
}


def load_suite(
    suite: str, num_prompts: int | None = None, turns: str = "first"
) -> list[BenchPrompt]:
    """The prompts of `suite` (a name or a file), at most `num_prompts` of them; `turns`
    "all" keeps every user turn of a file's conversations (its `turns`)."""
    if turns not in TURNS:
        raise SpecgenError(f"--turns must be first or all (got {turns!r})")
    if suite == BUILTIN:
        prompts = _read_jsonl(BUILTIN_FILE, "builtin")
    elif suite in PUBLIC:
        prompts = _fetch_public(suite, PUBLIC[suite])
    elif Path(suite).suffix == ".jsonl" or Path(suite).exists():
        prompts = _read_jsonl(Path(suite), suite)
    else:
        names = ", ".join([BUILTIN, *PUBLIC])
        raise SpecgenError(f"unknown suite {suite!r}: give one of {names}, or a .jsonl file")
    if num_prompts is not None:
        if num_prompts < 1:
            raise SpecgenError(f"--num-prompts must be at least 1 (got {num_prompts})")
        prompts = _round_robin(prompts, num_prompts)
    if turns == "first":
        return [BenchPrompt(p.category, p.text) for p in prompts]
    return prompts  # an empty turn was refused with its line (text/prompts.py)


def _round_robin(prompts: list[BenchPrompt], n: int) -> list[BenchPrompt]:
    by_category: dict[str, list[BenchPrompt]] = {}
    for p in prompts:
        by_category.setdefault(p.category, []).append(p)
    chosen: list[BenchPrompt] = []
    depth = 0
    while len(chosen) < min(n, len(prompts)):
        for items in by_category.values():
            if depth < len(items) and len(chosen) < n:
                chosen.append(items[depth])
        depth += 1
    order = {id(p): i for i, p in enumerate(prompts)}  # keep categories grouped as in the file
    return sorted(chosen, key=lambda p: (list(by_category).index(p.category), order[id(p)]))


def _read_jsonl(path: Path, label: str, field: str | None = None) -> list[BenchPrompt]:
    rows = read_prompts(path, what="suite file", jsonl=True, field=field)
    for row in rows:
        if not row.text.strip():
            raise PromptError(f"{label}: line {row.number} has no prompt text")
    return [BenchPrompt(row.category or "default", row.text, row.turns[1:]) for row in rows]


def _fetch_public(name: str, spec: PublicSet) -> list[BenchPrompt]:
    from specgen.hub import download_dataset_file

    path = download_dataset_file(spec.repo, spec.filename)
    if spec.filename.endswith(".jsonl"):
        rows = _read_jsonl(path, name, spec.field)
        if spec.category is None:
            rows = [BenchPrompt(name, p.text) for p in rows]
        return rows
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise SpecgenError(f"suite {name} is a parquet file: pip install pyarrow") from None
    table = pq.read_table(path).to_pylist()
    prompts = []
    for i, row in enumerate(table, start=1):
        category = str(row.get(spec.category)) if spec.category else name
        text = prompt_text(row, spec.field)
        if text is None or not text.strip():
            raise PromptError(f"{name}: row {i} has no prompt text (expected {spec.field!r})")
        prompts.append(BenchPrompt(category, text))
    return prompts
