"""The overlap engine gives exactly the sync loop's tokens and stats, and leaves the caches
consistent when the caller stops early."""

from __future__ import annotations

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.events import StepEvent
from specgen.engine.overlap import overlapped

PROMPTS = ["The quick brown fox", "one two three one two three one two three one"]


@pytest.fixture(scope="module")
def base(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _specs(tiny_dflash, tiny_dspark):
    return {
        "ar": {},
        "ngram": {"method": "ngram"},
        "dflash": {"method": "dflash", "drafter": str(tiny_dflash)},
        "dspark": {"method": "dspark", "drafter": str(tiny_dspark)},
    }


def _counters(stats):
    return (stats.steps, stats.verified, stats.accepted, stats.new_tokens, stats.finish_reason)


@pytest.mark.parametrize("name", ["ar", "ngram", "dflash", "dspark"])
@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(0.9, top_k=20, seed=7)])
def test_overlap_equals_sync(base, tiny_dflash, tiny_dspark, name, sampling):
    kw = _specs(tiny_dflash, tiny_dspark)[name]
    pipes = {
        engine: base.with_spec(SpecConfig(verify_policy="threshold=0.1", engine=engine, **kw))
        for engine in ("sync", "overlap")
    }
    for prompt in PROMPTS:
        for max_new in (1, 7, 40):  # limits that fall inside drafted blocks, and EOS
            got = {
                engine: pipe.generate(
                    prompt,
                    raw=True,
                    sampling=sampling,
                    max_new_tokens=max_new,
                    session=pipe.new_session(),
                )
                for engine, pipe in pipes.items()
            }
            assert got["overlap"].token_ids == got["sync"].token_ids
            assert _counters(got["overlap"].stats) == _counters(got["sync"].stats)


def test_multi_turn_continuation_matches(base, tiny_dspark):
    kw = {"method": "dspark", "drafter": str(tiny_dspark), "verify_policy": "full"}
    answers = {}
    for engine in ("sync", "overlap"):
        pipe = base.with_spec(SpecConfig(engine=engine, **kw))
        session = pipe.new_session()
        history = [{"role": "user", "content": "Hello there"}]
        first = pipe.generate(history, max_new_tokens=12, session=session)
        history += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And then?"},
        ]
        second = pipe.generate(history, max_new_tokens=12, session=session)
        assert second.stats.prefill_tokens < second.stats.prompt_tokens  # the cache was reused
        answers[engine] = (first.token_ids, second.token_ids)
    assert answers["overlap"] == answers["sync"]


def test_stopping_early_leaves_the_caches_at_what_was_consumed(base, tiny_dflash):
    pipe = base.with_spec(SpecConfig(method="dflash", drafter=str(tiny_dflash), engine="overlap"))
    session = pipe.new_session()
    ids = pipe.encode("The quick brown fox", raw=True)
    stream = pipe.stream_ids(ids, max_new_tokens=60, session=session)
    seen = []
    for _ in range(3):
        seen.extend(next(stream).token_ids)
    stream.close()  # what Ctrl-C in the caller amounts to
    assert session.ids == ids + seen
    assert session.cache.length == len(session.ids) == session.drafter.context.length
    # and the conversation goes on exactly as if the first answer had ended there
    again = pipe.generate("The quick brown fox", raw=True, max_new_tokens=5, session=session)
    fresh = pipe.generate("The quick brown fox", raw=True, max_new_tokens=5)
    assert again.token_ids == fresh.token_ids


def test_errors_in_the_compute_thread_reach_the_caller():
    def events():
        yield StepEvent(tokens=(1,))
        raise RuntimeError("boom in step 2")

    stream = overlapped(events)
    assert next(stream).tokens == (1,)
    with pytest.raises(RuntimeError, match="boom in step 2"):
        next(stream)


def test_bad_engine_is_refused():
    from specgen.core.errors import SpecgenError

    with pytest.raises(SpecgenError, match="--engine must be auto, overlap or sync"):
        SpecConfig(engine="async")


def test_auto_engine_overlaps_only_on_cuda(base):
    assert base.with_spec(SpecConfig(method="ngram")).overlaps is False  # a CPU model
    assert base.with_spec(SpecConfig(method="ngram", engine="overlap")).overlaps is True


def test_plain_ar_loaded_keeps_its_engine_and_trace(tiny_qwen3_deep):
    """`specgen generate --engine overlap` (or `--trace`) without a drafter: the AR pipeline
    that `Pipeline.load` returns runs with those settings, not the defaults."""
    spec = SpecConfig(engine="overlap", trace=True)
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    assert ar.spec == spec and ar.overlaps is True
    done = ar.generate("Hello", max_new_tokens=3, session=ar.new_session())
    assert done.stats.trace is not None and len(done.stats.trace) == done.stats.steps
    sync = Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=SpecConfig(engine="sync"))
    assert sync.overlaps is False
    assert sync.generate("Hello", max_new_tokens=3).token_ids == done.token_ids
