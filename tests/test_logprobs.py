"""Logprobs: the target's own raw distribution (log_softmax of its logits) at every answer
token, the same with and without speculation, equal to transformers' own; and a prompt's
logprobs (OpenAI's echo), after which the session holds the prompt."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams
from specgen.engine import score

TOP = 5
PROMPTS = ("The quick brown fox", "one two one two one two", "Café, naïve, 東京, привет")


def hf_logprobs(hf, ids: list[int]) -> torch.Tensor:
    """transformers' log_softmax over its logits: row i for ids[i + 1]."""
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, -1)


def assert_matches(logprobs, tokens, reference: torch.Tensor, atol: float = 1e-4) -> None:
    """`logprobs` (TokenLogprobs) against `reference` rows [len(tokens), V]."""
    assert [t.token for t in logprobs] == list(tokens)
    for lp, row in zip(logprobs, reference, strict=True):
        assert lp.logprob == pytest.approx(float(row[lp.token]), abs=atol)
        values, ids = row.topk(TOP)
        assert [v for _, v in lp.top] == pytest.approx(values.tolist(), abs=atol)
        # each top token's own value; two within fp32 rounding of each other may come in
        # either order (a near-tie the reference's summation order breaks its own way)
        for (i, v), want in zip(lp.top, ids.tolist(), strict=True):
            assert i == want or abs(float(row[i]) - float(row[want])) <= atol, (lp.top, ids)
            assert v == pytest.approx(float(row[i]), abs=atol)


def assert_same(got, want, atol: float = 1e-5) -> None:
    """The same tokens and top tokens, values equal up to fp32 rounding."""
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.token == b.token and a.logprob == pytest.approx(b.logprob, abs=atol)
        assert [i for i, _ in a.top] == [i for i, _ in b.top]
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=atol)


def answer(pipe, prompt_ids, params, n=16, session=None):
    ids, logprobs, text, pieces = [], [], "", []
    for chunk in pipe.stream_ids(
        prompt_ids, sampling=params, max_new_tokens=n, session=session or pipe.new_session()
    ):
        ids += chunk.token_ids
        logprobs += chunk.logprobs
        text += chunk.text
        pieces += chunk.token_text
        if params.logprobs is not None:
            stop = chunk.stats.finish_reason == "stop"  # the stop token's comes last
            assert (
                len(chunk.logprobs) == len(chunk.token_ids) + stop == len(chunk.token_text) + stop
            )
            assert "".join(chunk.token_text) == chunk.text
    return ids, logprobs, text, pieces, chunk.stats


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_ar_logprobs_are_transformers_log_softmax(tiny_dirs, family):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs[family], dtype=torch.float32).eval()
    pipe = Pipeline.load(str(tiny_dirs[family]), device="cpu", dtype="float32")
    for params in (
        SamplingParams(logprobs=TOP),
        SamplingParams(temperature=1.0, seed=3, logprobs=TOP),
    ):
        for text in PROMPTS:
            prompt = pipe.encode(text, raw=True)
            ids, logprobs, *_ = answer(pipe, prompt, params)
            reference = hf_logprobs(hf, prompt + ids)[len(prompt) - 1 : -1]
            assert_matches(logprobs, ids, reference)


def test_every_method_reports_ar_s_logprobs(pipes):
    """Greedy: the same tokens and, from the verify rows, the same values as AR's
    one-token forwards (fp32: a different number of rows in a forward rounds apart)."""
    params = SamplingParams(logprobs=TOP)
    accepted = 0
    for text in PROMPTS:
        prompt = pipes["ar"].encode(text, raw=True)
        want_ids, want, want_text, want_pieces, _ = answer(pipes["ar"], prompt, params, 24)
        assert want_text == pipes["ar"].generate(text, raw=True, max_new_tokens=24).text
        for method, pipe in pipes.items():
            ids, got, text_, pieces, stats = answer(pipe, prompt, params, 24)
            assert (ids, text_, pieces) == (want_ids, want_text, want_pieces), method
            assert_same(got, want)
            accepted += stats.accepted
    assert accepted > 0  # accepted drafts' logprobs came from verify rows


@pytest.mark.parametrize(
    "settings",
    [dict(temperature=1.0, top_k=20), dict(temperature=0.7, repetition_penalty=1.5,
                                           frequency_penalty=1.0)],
    ids=["sampled", "penalised"],
)  # fmt: skip
def test_sampled_and_penalised_answers_report_the_raw_distribution(pipes, hf_deep, settings):
    """Whatever chose the tokens (a seed, penalties, a drafter), each reported value is
    log_softmax of the target's raw logits at that position."""
    for pipe in pipes.values():
        prompt = pipe.encode("one two one two one two", raw=True)
        params = SamplingParams(seed=5, logprobs=TOP, **settings)
        ids, logprobs, *_ = answer(pipe, prompt, params, 20)
        reference = hf_logprobs(hf_deep, prompt + ids)[len(prompt) - 1 : -1]
        assert_matches(logprobs, ids, reference)


def test_the_resident_loop_reports_the_sync_loop_s_logprobs(pipes, monkeypatch):
    params = SamplingParams(logprobs=3, repetition_penalty=1.3)
    prompt = pipes["ar"].encode("one two one two one two", raw=True)
    for method in ("dflash", "dspark", "stacked"):
        sync = answer(pipes[method], prompt, params, 24)
        with monkeypatch.context() as m:
            m.setattr(Pipeline, "resident_steps", property(lambda self: True))
            resident = answer(pipes[method], prompt, params, 24)
        assert resident[0] == sync[0] and resident[3] == sync[3], method
        assert_same(resident[1], sync[1])  # the same rows (its static forward rounds apart)


def test_logprobs_off_is_nothing_and_zero_is_the_chosen_token_only(pipes):
    prompt = pipes["ar"].encode("The quick brown fox", raw=True)
    ids, logprobs, text, pieces, _ = answer(pipes["dflash"], prompt, SamplingParams(logprobs=0))
    assert len(logprobs) == len(ids) and all(lp.top == () for lp in logprobs)
    chunks = list(pipes["dflash"].stream_ids(prompt, max_new_tokens=8))
    assert all(c.logprobs == () and c.token_text == () for c in chunks)
    done = pipes["ar"].generate("The quick brown fox", raw=True, max_new_tokens=4)
    assert done.logprobs is None and "logprobs" not in done.to_dict()
    done = pipes["ar"].generate(
        "The quick brown fox", raw=True, max_new_tokens=4, sampling=SamplingParams(logprobs=2)
    )
    record = done.to_dict()["logprobs"]
    assert [r["token"] for r in record] == done.token_ids and len(record[0]["top"]) == 2


# --- the prompt's logprobs --------------------------------------------------------------------


@pytest.mark.parametrize("rows", [512, 3])  # one forward; several blocks of rows
@pytest.mark.parametrize("method", ["ar", "dflash", "eagle3"])
def test_prompt_logprobs_are_transformers_and_leave_the_prompt_cached(
    pipes, hf_deep, method, rows, monkeypatch
):
    monkeypatch.setattr(score, "ROWS", rows)
    pipe = pipes[method]
    session = pipe.new_session()
    answer(pipe, pipe.encode("def add(a, b):", raw=True), SamplingParams(), 6, session)  # busy
    for text in PROMPTS:
        prompt = pipe.encode(text, raw=True)
        scored = pipe.prompt_logprobs(prompt, top=TOP, session=session)
        assert_matches(scored, prompt[1:], hf_logprobs(hf_deep, prompt)[:-1])
        assert session.ids == prompt and session.cache.length == len(prompt)
        ids, *_, stats = answer(pipe, prompt, SamplingParams(), 12, session)
        assert stats.prefill_tokens == 1  # the answer reused the scored prompt
        fresh = answer(pipes["ar"], prompt, SamplingParams(), 12)[0]
        assert ids == fresh  # and the caches (the drafter's too) were consistent


def test_prompt_logprobs_bad_input(pipes):
    from specgen.core.errors import OptionError, PromptError
    from specgen.models.cache.kv import ContextLimitError

    pipe = pipes["ar"]
    with pytest.raises(OptionError):
        pipe.prompt_logprobs([1, 2], top=21)
    with pytest.raises(PromptError):
        pipe.prompt_logprobs([])
    session = pipe.new_session()
    answer(pipe, [5, 6, 7], SamplingParams(), 4, session)
    with pytest.raises(ContextLimitError):
        pipe.prompt_logprobs([5] * pipe.context, session=session)
    assert pipe.prompt_logprobs([9]) == []  # one token: nothing before it to score by


@pytest.mark.parametrize("method", ["ar", "dflash", "dspark"])
def test_the_stop_token_that_ends_an_answer_is_reported_last(pipes, hf_deep, method, monkeypatch):
    """Not part of the answer, but chosen at its position: vLLM and OpenAI report it, and
    lm-eval reads one entry per new token (its loglikelihood requests ask for one)."""
    pipe = pipes[method]
    prompt = pipe.encode("The quick brown fox", raw=True)
    free = answer(pipe, prompt, SamplingParams(), 12)[0]
    stop = free[5]
    monkeypatch.setattr(pipe.codec, "stop_ids", frozenset({stop}))
    ids, logprobs, *_, stats = answer(pipe, prompt, SamplingParams(logprobs=TOP), 12)
    assert stats.finish_reason == "stop" and ids == free[: free.index(stop)]
    reference = hf_logprobs(hf_deep, prompt + ids + [stop])[len(prompt) - 1 : -1]
    assert_matches(logprobs, ids + [stop], reference)
    done = pipe.generate("The quick brown fox", raw=True, max_new_tokens=12,
                         sampling=SamplingParams(logprobs=0))  # fmt: skip
    assert [t.token for t in done.logprobs] == done.token_ids + [stop]


@pytest.mark.parametrize("family", ["qwen3_5", "gemma4"])
def test_a_scored_answer_has_the_logprobs_it_was_generated_with(family, request, monkeypatch):
    """Hybrid (Gated DeltaNet state) and sliding-window targets, scored a few rows a
    forward: the prompt + answer scored gives the answer's own logprobs back."""
    monkeypatch.setattr(score, "ROWS", 3)
    path = request.getfixturevalue(f"tiny_{family}")
    pipe = Pipeline.load(str(path), device="cpu", dtype="float32")
    prompt = pipe.encode("one two one two one two", raw=True)
    ids, logprobs, *_ = answer(pipe, prompt, SamplingParams(logprobs=TOP), 10)
    scored = pipe.prompt_logprobs(prompt + ids, top=TOP, session=pipe.new_session())
    assert_same(scored[len(prompt) - 1 :], logprobs[: len(ids)], atol=1e-4)
