"""Training data: the target's own answers to a set of prompts, generated in batches.

A drafter learns to predict what its target says, so the target answers the training
prompts with specgen's own model code: chat template, prompts cut to `prompt_tokens`,
left-padded batches (`Transformer.forward(pad=...)`), greedy, rows dropped from the batch
as they finish. Prompts are sorted by length inside shuffled chunks, so a batch wastes
little on padding while every source stays represented early on.

On the CPU the answers come from the library's continuous batching instead (cli/train_answers.py):
the fused pass the target then verifies drafts with, so the drafter learns the very tokens
it will be checked against (these eager batches left them in 20 of 32 answers), and
2.4-2.6x faster here (benchmarks/train_answers.py).

Answers are appended to a JSONL file as each one ends (prompt ids, answer ids, the dtype
and decoding used); a rerun skips the prompts already answered, so a stopped run
resumes. Hidden states are not stored with them: `features.py` recomputes them with one
parallel forward per answer, far cheaper than generating and kept on disk once computed.

dtype: bf16 is 3x faster than fp32 on CPUs with native bf16 (AVX512-BF16/AMX) and 3x
slower on those without (measured here: AVX2 EPYC, fp32 158 tok/s vs bf16 ~50 at batch
32), so "auto" takes bf16 on CUDA and on such CPUs, fp32 elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from specgen.models.transformer import Transformer


def generation_dtype(device: torch.device) -> torch.dtype:
    if device.type == "cuda":
        return torch.bfloat16
    capability = torch.backends.cpu.get_cpu_capability()
    return torch.bfloat16 if capability in ("AVX512_BF16", "AMX") else torch.float32


def prompt_key(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def batch_order(prompts: list[str], encode: Callable[[str], list[int]], seed: int = 0):
    """(text, ids) in generation order: shuffled, then sorted by length in chunks of 256."""
    items = [(text, encode(text)) for text in prompts]
    random.Random(seed).shuffle(items)
    return [
        item
        for c in range(0, len(items), 256)
        for item in sorted(items[c : c + 256], key=lambda item: len(item[1]))
    ]


@torch.inference_mode()
def greedy_batch(
    model: Transformer, prompts: list[list[int]], max_new_tokens: int, stop_ids: frozenset[int]
) -> list[list[int]]:
    """Greedy answers to left-padded prompts; an answer ends after its first stop token."""
    width = max(len(p) for p in prompts)
    device = model.device
    pad = torch.tensor([width - len(p) for p in prompts], device=device)
    tokens = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
    cache = model.new_cache(width + max_new_tokens, batch=len(prompts))
    answers: list[list[int]] = [[] for _ in prompts]
    live = list(range(len(prompts)))  # original index of each row still in the batch
    logits = model(tokens, cache, num_logits=1, pad=pad).logits[:, -1]
    for _ in range(max_new_tokens):
        next_ids = logits.argmax(-1).tolist()
        keep = []
        for row, (index, token) in enumerate(zip(live, next_ids, strict=True)):
            answers[index].append(token)
            if token not in stop_ids:
                keep.append(row)
        if not keep or len(answers[live[0]]) == max_new_tokens:
            break
        if len(keep) < len(live):  # finished rows leave the batch
            rows = torch.tensor(keep, device=device)
            cache.keep_rows(rows)
            pad = pad[rows]
            live = [live[r] for r in keep]
            next_ids = [next_ids[r] for r in keep]
        step = torch.tensor(next_ids, device=device)[:, None]
        logits = model(step, cache, pad=pad).logits[:, -1]
    return answers


def read_answers(path: Path) -> list[dict]:
    """The rows of an answers file; a torn last line (a run killed mid-write) is dropped
    (and rewritten, so appending goes on from a clean line)."""
    text = path.read_text(encoding="utf-8")
    lines = [line for line in text.split("\n") if line.strip()]
    rows = []
    for i, line in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i != len(lines) - 1:
                raise
            path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows


def unanswered(prompts: list[str], out: Path) -> list[str]:
    """The prompts `out` holds no answer to yet, once each."""
    done = {row.get("key") for row in read_answers(out)} if out.is_file() else set()
    return [text for text in dict.fromkeys(prompts) if prompt_key(text) not in done]


# prompt ids of every prompt to answer -> (its index, its answer) as each answer ends; an
# answer ends with the stop token that ended it, if one did
Answerer = Callable[[list[list[int]]], Iterator[tuple[int, list[int]]]]


def in_batches(model: Transformer, batch: int, max_new_tokens: int,
               stop_ids: frozenset[int]) -> Answerer:  # fmt: skip
    """`greedy_batch` over the prompts, `batch` at a time (the GPU's way: one wide eager
    forward of left-padded rows)."""

    def answer(prompts: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        for first in range(0, len(prompts), batch):
            group = prompts[first : first + batch]
            for i, ids in enumerate(greedy_batch(model, group, max_new_tokens, stop_ids)):
                yield first + i, ids

    return answer


def answer_prompts(
    answer: Answerer,
    encode: Callable[[str], list[int]],
    prompts: list[str],
    out: Path,
    *,
    meta: dict,
) -> Iterator[dict]:
    """Append the target's answers to `out` as each ends (`meta`: what every row records of
    how they were made); yields progress rows. A stopped run loses only the answers it had
    not finished."""
    order = batch_order(unanswered(prompts, out), encode)
    out.parent.mkdir(parents=True, exist_ok=True)
    made = answered = 0
    with out.open("a", encoding="utf-8") as f:
        for i, ids in answer([ids for _, ids in order]):
            text, prompt_ids = order[i]
            row = {"key": prompt_key(text), "prompt_ids": prompt_ids, "response_ids": ids}
            f.write(json.dumps(row | meta) + "\n")
            f.flush()
            made, answered = made + len(ids), answered + 1
            yield {"answered": answered, "of": len(order), "tokens": made}
