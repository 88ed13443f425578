"""Answers stepped together (engine/stepper.py, engine/batch.py, api/streams.py) against the
loops they are split from: each answer in a batch is the answer it is alone, token for
token and (seeded) draw for draw, whatever shares its steps, for every method."""

from __future__ import annotations

import pytest
import torch

from specgen.api.streams import Streams, generate_many
from specgen.core.config import SamplingParams
from specgen.core.errors import Cancelled, SpecgenError
from specgen.engine import prefill as prefill_module
from specgen.engine.ar import generate_ar
from specgen.engine.batch import Batch
from specgen.engine.loop import generate_speculative
from specgen.engine.session import Session
from specgen.engine.stepper import Stepper
from specgen.models.loading import load_target
from support.scripted_drafters import OracleDrafter

PROMPTS = ["The quick brown fox", "one two one two one two", "Hello", "a b c d e f g"]
SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=11)
PENALISED = SamplingParams(temperature=0.7, seed=2, presence_penalty=0.5, repetition_penalty=1.2)


@pytest.fixture(scope="module")
def model(tiny_llama):
    return load_target(tiny_llama, dtype=torch.float32, device="cpu")


def stepped(session: Session, new_ids, **options):
    """An answer stepped alone through `Batch`: its events."""
    stepper = Stepper(session, new_ids, **options)
    batch, events = Batch(), []
    while not stepper.done:
        (outcome,) = batch.step([stepper])
        assert outcome.error is None, outcome.error
        if outcome.event is not None:
            events.append(outcome.event)
    return events


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED, PENALISED])
def test_a_stepped_answer_is_plain_decodings(model, params):
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    options = dict(params=params, max_new_tokens=20, stop_ids=frozenset())
    alone = list(generate_ar(model, model.new_cache(64), prompt, **options))
    events = stepped(Session(model, 64), prompt, **options)
    assert [e.tokens for e in events] == [e.tokens for e in alone]


@pytest.mark.parametrize("params", [SamplingParams(), SEEDED])
def test_a_stepped_answer_is_the_speculative_loops(model, params):
    prompt = [5, 17, 42, 99, 7, 3, 250, 11]
    options = dict(params=params, max_new_tokens=20, stop_ids=frozenset({3}))
    loop = list(generate_speculative(model, model.new_cache(64), OracleDrafter(model), prompt,
                                     **options))  # fmt: skip
    events = stepped(Session(model, 64, OracleDrafter(model)), prompt, **options)
    assert events == loop  # tokens, drafts, verify lengths, bonus tokens, finish


def test_a_context_that_fills_up_ends_as_alone(model):
    prompt = list(range(3, 20))
    options = dict(params=SamplingParams(), max_new_tokens=50, stop_ids=frozenset())
    loop = list(generate_speculative(model, model.new_cache(24), OracleDrafter(model), prompt,
                                     **options))  # fmt: skip
    events = stepped(Session(model, 24, OracleDrafter(model)), prompt, **options)
    assert events == loop and events[-1].finish == "context"


def alone(pipe, prompt: str, **options) -> list[int]:
    out: list[int] = []
    for chunk in pipe.stream_ids(pipe.encode(prompt, raw=True), session=pipe.new_session(),
                                 **options):  # fmt: skip
        out += chunk.token_ids
    return out


@pytest.mark.integration
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("method", ["ar", "ngram", "dflash", "dspark", "eagle3", "stacked"])
def test_every_method_answers_in_a_batch_as_alone(pipes, method, sampling):
    pipe = pipes[method]
    lengths = [16, 9, 20, 5]  # answers end at different steps: slots free and refill
    want = [alone(pipe, p, sampling=sampling, max_new_tokens=n)
            for p, n in zip(PROMPTS, lengths, strict=True)]  # fmt: skip
    streams = Streams(pipe, parallel=3)
    got: dict[int, list[int]] = {}
    waiting = list(range(len(PROMPTS)))
    opened = {}
    while waiting or streams.active:
        while waiting and streams.free:
            i = waiting.pop(0)
            ids = pipe.encode(PROMPTS[i], raw=True)
            opened[id(streams.open(ids, sampling=sampling, max_new_tokens=lengths[i]))] = i
        for stream, chunk in streams.step():
            assert not isinstance(chunk, Exception), chunk
            got.setdefault(opened[id(stream)], []).extend(chunk.token_ids)
    assert [got[i] for i in range(len(PROMPTS))] == want
    assert streams.counters.by_size.get(3, 0) > 0  # three answers did share steps


@pytest.mark.integration
def test_logprobs_and_penalties_in_a_batch_are_as_alone(pipes):
    pipe = pipes["dflash"]
    params = SamplingParams(temperature=0.9, seed=4, frequency_penalty=0.4, logprobs=3)
    want = [pipe.generate(p, sampling=params, max_new_tokens=12, raw=True,
                          session=pipe.new_session()) for p in PROMPTS]  # fmt: skip
    got = generate_many(pipe, PROMPTS, parallel=4, sampling=params, max_new_tokens=12, raw=True)
    assert [c.token_ids for c in got] == [c.token_ids for c in want]
    assert [c.logprobs for c in got] == [c.logprobs for c in want]


def test_prompts_read_in_chunks_between_the_others_steps(pipes, monkeypatch):
    pipe = pipes["ar"]
    chunked = prefill_module.bounds
    monkeypatch.setattr(prefill_module, "bounds", lambda n, size=8: chunked(n, 8))
    long = " ".join(["word"] * 16)  # about 80 tokens: many chunks of 8
    want = [alone(pipe, p, max_new_tokens=6) for p in (long, "Hello")]
    streams = Streams(pipe, parallel=2, chunk=8)
    first = streams.open(pipe.encode(long, raw=True), max_new_tokens=6)
    short = streams.open(pipe.encode("Hello", raw=True), max_new_tokens=6)
    out: dict[int, list[int]] = {id(first): [], id(short): []}
    order = []
    while streams.active:
        for stream, chunk in streams.step():
            out[id(stream)] += chunk.token_ids
            order.append(stream is short)
    assert [out[id(first)], out[id(short)]] == want
    assert order[:6] == [True] * 6  # the short answer was done while the long prompt was read


def test_prompts_read_together_share_a_budget_of_rows(pipes, monkeypatch):
    """Three long prompts and a short one arriving together: each step reads at most one
    chunk's worth of prompt rows (the first prompt chosen always runs), the short prompt
    first, a prompt held back `PATIENCE` steps goes first, and every answer is its own."""
    from specgen.engine import batch as batch_module

    pipe = pipes["ar"]
    chunked = prefill_module.bounds
    monkeypatch.setattr(prefill_module, "bounds", lambda n, size=8: chunked(n, 8))
    longs = [" ".join([w] * 12) for w in ("red", "green", "blue")]  # several chunks each
    texts = [*longs, "Hello"]
    want = [alone(pipe, t, max_new_tokens=5) for t in texts]
    reads: list[int] = []  # prompt rows each step read
    forward_all = batch_module.forward_all

    def counted(planned):
        reads.append(sum(len(rows.tokens) for rows in planned if rows.prefill))
        return forward_all(planned)

    monkeypatch.setattr(batch_module, "forward_all", counted)
    streams = Streams(pipe, parallel=4, chunk=8)
    opened = [streams.open(pipe.encode(t, raw=True), max_new_tokens=5) for t in texts]
    out: dict[int, list[int]] = {id(s): [] for s in opened}
    first_token: dict[int, int] = {}
    step = 0
    while streams.active:
        for stream, chunk in streams.step():
            out[id(stream)] += chunk.token_ids
            first_token.setdefault(id(stream), step)
        step += 1
    assert [out[id(s)] for s in opened] == want
    assert max(reads) <= 8  # one chunk's worth a step (chunks here are at most 8 rows)
    short = first_token[id(opened[-1])]
    assert short == 0 and all(first_token[id(s)] > short for s in opened[:-1])
    assert len(reads) > 4 * 3  # the long prompts took turns: their chunks were not one step


def test_a_prompt_held_back_goes_first_after_patience():
    """Short prompts arriving every step never keep a long one waiting for good."""
    from types import SimpleNamespace

    from specgen.engine.batch import PATIENCE

    def reading(left: int, rows: int):
        return SimpleNamespace(prefilling=True, prompt_left=left, rows_now=lambda: rows)

    batch = Batch(prompt_rows=8)
    long = reading(100, 8)
    held_steps = 0
    for _ in range(PATIENCE + 1):
        short = reading(4, 4)  # a new short prompt each step: it would always go first
        held = batch._hold([long, short])
        if id(long) in held:
            held_steps += 1
        else:
            assert id(short) in held  # the long one went first; the short waits its turn
            break
    assert held_steps == PATIENCE


def test_closing_an_answer_frees_its_slot_and_keeps_its_cache(pipes):
    pipe = pipes["ar"]
    streams = Streams(pipe, parallel=1)
    ids = pipe.encode("The quick brown fox", raw=True)
    stream = streams.open(ids, max_new_tokens=30)
    with pytest.raises(SpecgenError, match="all 1 slots"):
        streams.open(ids)
    produced = []
    for _ in range(3):
        for _, chunk in streams.step():
            produced += chunk.token_ids
    streams.close(stream)
    assert streams.free == 1 and stream.ended and not streams.active
    # its session holds what it produced, so the same conversation continues from there
    again = streams.open(ids + produced, max_new_tokens=2)
    assert again.session is stream.session and again.stats.prefill_tokens == 1


def test_a_failing_answer_ends_alone(pipes):
    pipe = pipes["ar"]
    streams = Streams(pipe, parallel=2)
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return True

    bad = streams.open(pipe.encode("Hello", raw=True), max_new_tokens=4, cancel=cancel)
    good = streams.open(pipe.encode("The quick brown fox", raw=True), max_new_tokens=4)
    results = streams.step()
    errors = [got for s, got in results if s is bad]
    assert len(errors) == 1 and isinstance(errors[0], Cancelled) and bad.ended
    tokens = []
    while streams.active:
        tokens += [t for s, c in streams.step() if s is good for t in c.token_ids]
    first = [t for s, c in results if s is good for t in c.token_ids]
    assert first + tokens == alone(pipe, "The quick brown fox", max_new_tokens=4)


def test_an_idle_session_sharing_the_prompt_is_reused(pipes):
    pipe = pipes["dflash"]
    streams = Streams(pipe, parallel=2)
    a = streams.open(pipe.encode("The quick brown fox jumps", raw=True), max_new_tokens=3)
    b = streams.open(pipe.encode("Hello there", raw=True), max_new_tokens=3)
    while streams.active:
        streams.step()
    follow = pipe.encode("Hello there my friend", raw=True)
    c = streams.open(follow, max_new_tokens=3)
    assert c.session is b.session and c.session is not a.session
    assert c.stats.prefill_tokens < len(follow)
