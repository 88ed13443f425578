"""Training data: the target's own answers to a set of prompts, generated in batches.

A drafter learns to predict what its target says, so the target answers the training
prompts with specgen's own model code: chat template, prompts cut to `prompt_tokens`,
left-padded batches (`Transformer.forward(pad=...)`), greedy, rows dropped from the batch
as they finish. Prompts are sorted by length inside shuffled chunks, so a batch wastes
little on padding while every source stays represented early on.

Answers are appended to a JSONL file as each batch finishes (prompt ids, answer ids, the
dtype and decoding used); a rerun skips the prompts already answered, so a stopped run
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


def answer_prompts(
    model: Transformer,
    encode: Callable[[str], list[int]],
    prompts: list[str],
    out: Path,
    *,
    stop_ids: frozenset[int],
    batch: int = 32,
    max_new_tokens: int = 160,
) -> Iterator[dict]:
    """Append the target's answers to `out` batch by batch; yields progress rows."""
    done = {row.get("key") for row in read_answers(out)} if out.is_file() else set()
    todo = [text for text in dict.fromkeys(prompts) if prompt_key(text) not in done]
    order = batch_order(todo, encode)
    out.parent.mkdir(parents=True, exist_ok=True)
    dtype = str(model.dtype).removeprefix("torch.")
    made = 0
    for first in range(0, len(order), batch):
        group = order[first : first + batch]
        answers = greedy_batch(model, [ids for _, ids in group], max_new_tokens, stop_ids)
        lines = []
        for (text, ids), answer in zip(group, answers, strict=True):
            made += len(answer)
            row = {
                "key": prompt_key(text),
                "prompt_ids": ids,
                "response_ids": answer,
                "dtype": dtype,
                "greedy": True,
            }
            lines.append(json.dumps(row) + "\n")
        with out.open("a", encoding="utf-8") as f:
            f.write("".join(lines))  # one write per batch
        yield {"answered": first + len(group), "of": len(order), "tokens": made}
