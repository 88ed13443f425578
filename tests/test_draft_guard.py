"""The batch's draft guard (scheduling/guard.py): shared steps take turns drafting and not,
keep to the way that commits tokens faster, and an answer held back from drafting is still
the answer it is alone."""

from __future__ import annotations

import pytest

from specgen.api.streams import Streams
from specgen.core.config import SamplingParams, SpecConfig
from specgen.scheduling.cost import CostTable
from specgen.scheduling.guard import EPOCH, EXPLORE, DraftGuard, size_class

SEEDED = SamplingParams(temperature=0.8, top_k=20, seed=11)
# fixed prices under which every extra row is free, so ngram drafts wherever it may (prices
# handed in are taken as they are: no timing decides anything here)
FREE_ROWS = CostTable(contexts=(100,), seconds=(tuple([1.0] * 11),), drafts={"ngram": (0.0,)})
# short enough to be read in one step together: every step after it is shared by all four
PROMPTS = ["one two one two", "a b c a b c", "x y z x y z", "1 2 3 1 2 3"]


def epoch(guard: DraftGuard, answers: int, rate: dict[bool, float], reading: bool = False):
    """EPOCH steps of `answers`, each committing a token per answer at the way's rate."""
    ways = []
    for _ in range(EPOCH):
        way = guard.drafting(answers)
        ways.append(way)
        guard.ran(answers, answers, answers / rate[way], reading)
    assert len(set(ways)) == 1  # one way a whole epoch
    return ways[0]


def test_an_answer_alone_always_drafts():
    guard = DraftGuard()
    for _ in range(3 * EPOCH):
        assert guard.drafting(1)
        guard.ran(1, 1, 1.0, False)


@pytest.mark.parametrize("faster", [True, False], ids=["drafting", "plain"])
def test_the_faster_way_is_kept_and_the_other_tried_again(faster):
    guard = DraftGuard()
    rate = {faster: 300.0, not faster: 200.0}
    ways = [epoch(guard, 4, rate) for _ in range(4 * EXPLORE)]
    assert ways[:2] == [True, False]  # as the prices decide first, then without drafts
    later = ways[2:]
    assert later.count(not faster) == len(later) // EXPLORE  # one epoch in EXPLORE
    assert later.count(faster) == len(later) - len(later) // EXPLORE
    assert guard.rates(4)[faster] > guard.rates(4)[not faster]


def test_the_way_follows_the_rates_as_they_move():
    guard = DraftGuard()
    ways = [epoch(guard, 3, {True: 300.0, False: 200.0}) for _ in range(EXPLORE)]
    assert ways[-1] is True
    ways = [epoch(guard, 3, {True: 100.0, False: 200.0}) for _ in range(2 * EXPLORE)]
    assert ways[-EXPLORE + 1 :] == [False] * (EXPLORE - 1)


def test_sizes_are_judged_apart_and_prompt_steps_are_not_judged():
    guard = DraftGuard()
    for _ in range(EXPLORE + 1):
        epoch(guard, 8, {True: 100.0, False: 400.0})
    assert not guard.drafting(8) and guard.drafting(2)  # 2 answers: nothing seen yet
    assert size_class(2) != size_class(8) and size_class(5) == size_class(8)
    epoch(guard, 2, {True: 1.0, False: 1.0}, reading=True)  # every step read a prompt
    assert guard.rates(2) == {} and guard.drafting(2)  # untried ways stay untried


class Never(DraftGuard):
    """Holds every shared step's drafts back."""

    def drafting(self, answers: int) -> bool:
        return answers < 2


def answered(pipe, sampling, guard: DraftGuard | None = None, tokens: int = 14):
    """PROMPTS answered four at once (every step shared once they are read), and the
    batch's counters."""
    streams = Streams(pipe, parallel=len(PROMPTS))
    if guard is not None:
        streams.batch.guard = guard
    opened = {}
    for i, prompt in enumerate(PROMPTS):
        ids = pipe.encode(prompt, raw=True)
        stream = streams.open(ids, sampling=sampling, max_new_tokens=tokens, ignore_eos=True)
        opened[id(stream)] = i
    got: dict[int, list[int]] = {}
    while streams.active:
        for stream, chunk in streams.step():
            assert not isinstance(chunk, Exception), chunk
            got.setdefault(opened[id(stream)], []).extend(chunk.token_ids)
    return [got[i] for i in range(len(PROMPTS))], streams.counters


@pytest.mark.integration
@pytest.mark.parametrize("sampling", [None, SEEDED], ids=["greedy", "seeded"])
def test_answers_held_back_from_drafting_are_as_alone(pipes, sampling):
    pipe = pipes["ar"].with_spec(SpecConfig(method="ngram"), costs=FREE_ROWS)  # cost policy
    want, free = answered(pipe, sampling)
    got, held = answered(pipe, sampling, Never())
    assert got == want and free.held == 0
    if sampling is None:  # every step was shared: none drafted
        assert free.drafted > 0 and held.drafted == 0 and held.held > 0
    else:  # a seeded sample decides as if alone
        assert held.drafted == free.drafted and held.held == 0


@pytest.mark.integration
def test_an_explicit_verify_policy_is_not_held_back(pipes):
    pipe = pipes["ngram"]  # every draft verified whole, as asked
    want, free = answered(pipe, None)
    got, held = answered(pipe, None, Never())
    assert got == want and held.drafted == free.drafted > 0
