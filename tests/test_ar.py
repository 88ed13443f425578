"""AR decoding against the slow oracles, and the loop's edges (stop, length, context)."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams
from specgen.core.errors import PromptError
from specgen.engine.ar import generate_ar
from specgen.models.loading import load_target
from support.targets import FAMILIES

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11]
GREEDY = SamplingParams()


def _run(model, prompt, n, stop=frozenset(), capacity=128, params=GREEDY, lookahead=False):
    cache = model.new_cache(capacity)
    events = list(
        generate_ar(
            model, cache, prompt, params=params, max_new_tokens=n, stop_ids=stop,
            lookahead=lookahead,
        )
    )  # fmt: skip
    return [t for e in events for t in e.tokens], events[-1].finish, cache


def _no_cache_oracle(model, prompt, n):
    """Greedy decoding recomputing the whole sequence every token: no cache to get wrong."""
    seq = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([seq]), model.new_cache(len(seq))).logits
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt) :]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_generate_and_the_no_cache_oracle(tiny_dirs, family):
    from transformers import AutoModelForCausalLM

    model = load_target(tiny_dirs[family], dtype=torch.float32, device="cpu")
    ours, finish, _ = _run(model, PROMPT, 24)
    assert finish == "length" and len(ours) == 24
    assert ours == _no_cache_oracle(model, PROMPT, 24)
    hf = AutoModelForCausalLM.from_pretrained(tiny_dirs[family], dtype=torch.float32)
    out = hf.generate(
        torch.tensor([PROMPT]),
        max_new_tokens=24,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    assert ours == out[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("lookahead", [False, True])
def test_stop_token_ends_the_answer_and_is_not_emitted(tiny_llama, lookahead):
    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    free, _, _ = _run(model, PROMPT, 16)
    stop_at = 5
    stop = frozenset({free[stop_at]})
    first = free.index(free[stop_at])  # the stop token may occur earlier too
    out, finish, cache = _run(model, PROMPT, 16, stop=stop, lookahead=lookahead)
    assert finish == "stop" and out == free[:first]
    assert cache.length == len(PROMPT) + first  # everything emitted was fed back


@pytest.mark.parametrize("lookahead", [False, True])
def test_max_new_tokens_one(tiny_llama, lookahead):
    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    out, finish, cache = _run(model, PROMPT, 1, lookahead=lookahead)
    assert len(out) == 1 and finish == "length" and cache.length == len(PROMPT)


@pytest.mark.parametrize("lookahead", [False, True])
def test_context_limit_stops_cleanly_at_the_exact_token(tiny_llama, lookahead):
    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    free, _, _ = _run(model, PROMPT, 10)
    out, finish, cache = _run(model, PROMPT, 10, capacity=len(PROMPT) + 3, lookahead=lookahead)
    assert finish == "context" and out == free[:4] and cache.free == 0


def test_lookahead_samples_the_same_tokens(tiny_llama):
    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    params = SamplingParams(temperature=1.0, top_k=50, seed=11)
    plain, _, a = _run(model, PROMPT, 20, params=params)
    ahead, _, b = _run(model, PROMPT, 20, params=params, lookahead=True)
    assert ahead == plain and a.length == b.length


@pytest.fixture(scope="module")
def pipe(tiny_llama):
    return Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")


def test_prompt_longer_than_the_context_is_refused(tiny_llama):
    small = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32", context=8)
    with pytest.raises(PromptError, match="context limit is 8"):
        small.generate(
            "this prompt is certainly longer than eight tokens of the tiny model", raw=True
        )


def test_session_reuses_the_shared_prefix_without_changing_the_output(pipe):
    first = pipe.generate("The quick brown fox", raw=True, max_new_tokens=8)
    second = pipe.generate("The quick brown fox jumps", raw=True, max_new_tokens=8)
    fresh = pipe.generate(
        "The quick brown fox jumps", raw=True, max_new_tokens=8, session=pipe.new_session()
    )
    assert second.token_ids == fresh.token_ids
    assert second.stats.prefill_tokens < second.stats.prompt_tokens
    assert first.stats.prefill_tokens == first.stats.prompt_tokens


def test_an_abandoned_stream_leaves_the_session_consistent(pipe):
    session = pipe.new_session()
    stream = pipe.stream(
        "Speculative decoding drafts", raw=True, max_new_tokens=12, session=session
    )
    next(stream), next(stream), next(stream)
    stream.close()  # what Ctrl-C or a consumer that stops reading does
    assert session.cache.length == len(session.ids)
    again = pipe.generate(
        "Speculative decoding drafts", raw=True, max_new_tokens=12, session=session
    )
    fresh = pipe.generate(
        "Speculative decoding drafts", raw=True, max_new_tokens=12, session=pipe.new_session()
    )
    assert again.token_ids == fresh.token_ids


def test_seeded_sampling_through_the_pipeline(pipe):
    params = SamplingParams(temperature=1.0, top_p=0.9, seed=7)
    a = pipe.generate("The quick", raw=True, sampling=params, max_new_tokens=10)
    b = pipe.generate("The quick", raw=True, sampling=params, max_new_tokens=10)
    assert a.token_ids == b.token_ids


def test_stats_count_what_was_generated(pipe):
    out = pipe.generate("Hello", max_new_tokens=6)
    stats = out.stats.to_dict()
    assert stats["new_tokens"] == len(out.token_ids)
    assert stats["acceptance_length"] == 1.0 and stats["accepted_per_position"] == []
    assert stats["finish_reason"] in ("stop", "length")
    assert stats["seconds"] > 0 and stats["tokens_per_second"] > 0
