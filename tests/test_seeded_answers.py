"""A seeded answer depends on its conversation and its seed alone: asking the same prompt
again, or after other prompts, gives the same tokens, whatever the scheduler and the stacked
selector learnt in between (they decide which of the generator's draws fall on which token).
"""

from __future__ import annotations

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.scheduling.cost import CostTable

SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=3)


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _spec(method, tiny_dflash, tiny_dspark, engine):
    drafter = {
        "dflash": str(tiny_dflash),
        "dspark": str(tiny_dspark),
        "stacked": (str(tiny_dflash), str(tiny_dspark)),
        "suffix": None,
        "stacked+suffix": ("suffix", str(tiny_dflash)),
    }[method]
    return SpecConfig(method=method.partition("+")[0], drafter=drafter, engine=engine)


def _priced(ar, spec):
    """Fixed (GPU-like) prices instead of this machine's measured ones: measured costs are
    re-measured when the steps run 2x off them (a loaded machine), and new prices change
    the scheduler's decisions, so which draws fall on which token; this test is about what
    the scheduler learns, not about timing."""
    steps = tuple(1.0 + 0.01 * n for n in range(33))
    drafts = {"dflash": (0.1,), "dspark": (0.1,), "suffix": (0.0,)}  # with_spec keeps the mounted
    table = CostTable(contexts=(1,), seconds=(steps,), drafts=drafts)
    return ar.with_spec(spec, costs=table)


@pytest.mark.parametrize("engine", ["sync", "overlap"])
@pytest.mark.parametrize("method", ["dflash", "dspark", "stacked", "suffix", "stacked+suffix"])
def test_a_seeded_prompt_asked_again_gives_the_same_answer(
    ar, tiny_dflash, tiny_dspark, method, engine
):
    pipe = _priced(ar, _spec(method, tiny_dflash, tiny_dspark, engine))
    first = pipe.generate("The quick brown fox", sampling=SEEDED, max_new_tokens=24)
    # the scheduler has now learnt this drafter's (poor) acceptance, stacked's selector its
    # history and suffix's store the answer itself; none may change the next seeded answer
    pipe.generate("one two one two one two", sampling=SEEDED, max_new_tokens=24)
    again = pipe.generate("The quick brown fox", sampling=SEEDED, max_new_tokens=24)
    assert again.token_ids == first.token_ids
    fresh = _priced(ar, _spec(method, tiny_dflash, tiny_dspark, engine))
    alone = fresh.generate("The quick brown fox", sampling=SEEDED, max_new_tokens=24)
    assert alone.token_ids == first.token_ids


def test_unseeded_answers_still_start_from_what_was_learnt(ar, tiny_dspark):
    pipe = ar.with_spec(SpecConfig(method="dspark", drafter=str(tiny_dspark)))
    pipe.generate("The quick brown fox", max_new_tokens=24)
    learnt = pipe.schedulers.learnt
    assert learnt is not None and learnt.history.buckets  # it recorded steps
    session = pipe.new_session()
    assert session.scheduler.history == learnt.history
