"""Training answers: batched or streamed, each equals its prompt's greedy answer alone."""

from __future__ import annotations

import json

import torch

from specgen.api.pipeline import Pipeline
from specgen.cli.train_answers import streamed
from specgen.core.config import SamplingParams
from specgen.engine.ar import generate_ar
from specgen.models.loading import load_target
from specgen.training.generate import answer_prompts, batch_order, greedy_batch, in_batches


def _alone(model, prompt: list[int], n: int, stop: frozenset[int]) -> list[int]:
    cache = model.new_cache(len(prompt) + n)
    out = []
    for event in generate_ar(model, cache, prompt, params=SamplingParams(), max_new_tokens=n,
                             stop_ids=frozenset()):  # fmt: skip
        out.extend(event.tokens)
    for i, token in enumerate(out):
        if token in stop:
            return out[: i + 1]
    return out


def test_left_padded_batch_equals_each_prompt_alone(tiny_qwen3_deep):
    model = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    prompts = [[5, 17, 99, 3], [250, 8], [7, 7, 7, 7, 7, 7, 7, 31], [12]]
    alone = [_alone(model, p, 12, frozenset()) for p in prompts]
    assert greedy_batch(model, prompts, 12, frozenset()) == alone
    # a stop token ends that row only (it leaves the batch), the others go on
    stop = frozenset({alone[1][3]})
    want = [_alone(model, p, 12, stop) for p in prompts]
    assert any(len(w) < 12 for w in want) and any(len(w) == 12 for w in want)
    assert greedy_batch(model, prompts, 12, stop) == want


def test_answers_are_appended_and_a_rerun_resumes(tiny_qwen3_deep, tmp_path):
    model = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")

    def encode(text: str) -> list[int]:
        return [ord(c) % 300 for c in text]

    out = tmp_path / "answers.jsonl"
    meta = {"dtype": "float32", "greedy": True}
    first = list(answer_prompts(in_batches(model, 1, 5, frozenset()), encode, ["ab", "cde"],
                                out, meta=meta))  # fmt: skip
    assert [r["answered"] for r in first] == [1, 2]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {tuple(r["prompt_ids"]) for r in rows} == {(97, 98), (99, 100, 101)}
    assert all(len(r["response_ids"]) == 5 and r["dtype"] == "float32" for r in rows)
    again = list(answer_prompts(in_batches(model, 4, 5, frozenset()), encode,
                                ["ab", "cde", "fg"], out, meta=meta))  # fmt: skip
    assert again == [{"answered": 1, "of": 1, "tokens": 5}]  # only the new prompt
    assert len(out.read_text().splitlines()) == 3


def test_batches_group_similar_lengths_and_keep_every_prompt():
    texts = [f"p{i}" + "x" * (i % 7) for i in range(300)]
    order = batch_order(texts, lambda t: list(range(len(t))))
    assert sorted(t for t, _ in order) == sorted(texts)
    first = [len(ids) for _, ids in order[:256]]
    assert first == sorted(first)


def test_streamed_answers_are_the_pipelines_alone_with_their_stop_token(tiny_qwen3_deep):
    """The CPU's way: `parallel` answers at once through Streams, each the pipeline's own
    greedy answer, the stop token that ended it kept (as the eager batches keep it)."""
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    prompts = [[5, 17, 99, 3], [250, 8], [7, 7, 7, 7, 7, 7, 7, 31], [12], [40, 41]]
    pipe.codec.stop_ids = frozenset()
    alone = [
        [t for c in pipe.stream_ids(p, max_new_tokens=10) for t in c.token_ids] for p in prompts
    ]
    stop = alone[1][3]
    pipe.codec.stop_ids = frozenset({stop})
    want = []
    for a in alone:  # cut after the first stop token, which stays
        want.append(a[: a.index(stop) + 1] if stop in a else a)
    assert any(len(w) < 10 for w in want) and any(len(w) == 10 for w in want)
    got = dict(streamed(pipe, 2, 10)(prompts))
    assert [got[i] for i in range(len(prompts))] == want
