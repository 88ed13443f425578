"""`specgen train --prompts`: the target answers the training prompts (resumable).

On the CPU the answers come from the library's continuous batching (api/streams.py) over
the pipeline that decodes with the target: the fused pass, whose tokens are the ones a
drafter's drafts are later verified against, answering `batch` prompts at once and
starting the next as soon as one ends. Elsewhere (CUDA) they come from wide left-padded
eager batches (training/generate.py), the faster way there.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from specgen.terminal import display


def answer_training_prompts(model: str, resolved, device: str, prompts: list[Path], out: Path,
                            prompt_tokens: int, max_new_tokens: int, batch: int,
                            weights: dict) -> Path:  # fmt: skip
    """The target's answers to `prompts`, appended to OUT/answers.jsonl."""
    from specgen.text.prompts import read_prompts
    from specgen.training.generate import answer_prompts, unanswered

    texts = [p.text for path in prompts for p in read_prompts(path)]
    if device == "cpu":
        answer, codec, meta = _streamed(model, batch, max_new_tokens, weights)
    else:
        answer, codec, meta = _batched(resolved, device, batch, max_new_tokens, weights)

    def encode(text: str) -> list[int]:
        cut = codec.decode(codec.encode_raw(text)[:prompt_tokens])
        return codec.encode_chat([{"role": "user", "content": cut}])

    path = out / "answers.jsonl"
    todo = len(unanswered(texts, path))
    rows = answer_prompts(answer, encode, texts, path, meta=meta)
    with display.progress(todo, f"answering {todo} prompts ({meta['dtype']})") as advance:
        for row in rows:
            advance(f"{row['answered']}/{row['of']}, {row['tokens']} tokens")
    display.status(f"answers in {path}")
    return path


def _batched(resolved, device: str, batch: int, max_new_tokens: int, weights: dict):
    import torch

    from specgen.api.loader import load_weights
    from specgen.text.codec import TextCodec
    from specgen.training.generate import generation_dtype, in_batches

    dtype = generation_dtype(torch.device(device))
    model = load_weights(resolved, dtype, device, **weights)
    codec = TextCodec(resolved.path, resolved.name, model.args.eos_token_ids)
    meta = {"dtype": str(model.dtype).removeprefix("torch."), "greedy": True}
    return in_batches(model, batch, max_new_tokens, codec.stop_ids), codec, meta


def _streamed(model: str, parallel: int, max_new_tokens: int, weights: dict):
    from specgen.api.pipeline import Pipeline

    pipe = Pipeline.load(model, device="cpu", **weights)
    meta = {"dtype": str(pipe.model.dtype).removeprefix("torch."), "greedy": True,
            "engine": "streams"}  # fmt: skip
    return streamed(pipe, parallel, max_new_tokens), pipe.codec, meta


def streamed(pipe, parallel: int, max_new_tokens: int):
    """An `Answerer` (training/generate.py) that answers `parallel` prompts at a time
    through `Streams`, greedy; each answer keeps the stop token that ended it (its logprob
    entry names it), as the eager batches' answers do."""
    from specgen.api.streams import stream_many_ids
    from specgen.core.config import SamplingParams

    params = SamplingParams(logprobs=0)

    def answer(prompts: list[list[int]]) -> Iterator[tuple[int, list[int]]]:
        got: dict[int, list[int]] = {}
        chunks = stream_many_ids(pipe, prompts, parallel=parallel, sampling=params,
                                 max_new_tokens=max_new_tokens)  # fmt: skip
        for i, chunk in chunks:
            got.setdefault(i, []).extend(entry.token for entry in chunk.logprobs)
            if chunk.stats.finish_reason is not None:
                yield i, got.pop(i)

    return answer
