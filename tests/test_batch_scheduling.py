"""Drafting decided per batch (scheduling/batch.py): the prices a scheduler is handed when
it shares a step make its one rule the batch's rule, alone they are the table's, and the
batch engine drafts only where the extra rows pay for everyone in the step."""

from __future__ import annotations

import itertools

import pytest
import torch

from specgen.core.config import SamplingParams, VerifyPolicy
from specgen.core.draft import Draft, DraftOption
from specgen.engine.batch import Batch
from specgen.engine.session import Session
from specgen.engine.stepper import Stepper
from specgen.models.loading import load_target
from specgen.scheduling.batch import OneForward, SeparateForwards, batch_prices, rows_seconds
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import VerifyScheduler
from support.scripted_drafters import OracleDrafter

STEPS = (1.0, 1.3, 1.6, 1.9, 2.2)  # a forward over 1..5 rows of one answer
TABLE = CostTable(contexts=(100,), seconds=(STEPS,), drafts={"d": (0.05,)})


def test_alone_the_prices_are_the_tables_to_the_bit():
    for costs in (SeparateForwards(), OneForward(STEPS)):
        assert batch_prices(TABLE, costs, 100, [], 0) == TABLE.step_seconds(100)


def test_past_its_longest_verify_a_forward_is_priced_on_a_line():
    assert rows_seconds(TABLE, 100, 3) == 1.6
    assert rows_seconds(TABLE, 100, 9) == pytest.approx(2.2 + 4 * 0.3)


def test_a_noisy_tables_rows_are_priced_rising_and_past_it_by_its_mean_slope():
    """Timings (and the ratios a busy server's steps correct them by) are noisy: where a
    table's last entries fall, a forward of more rows must not look cheaper, nor rows past
    the table free (the slope of the last two once was negative: 8 answers' drafts were
    priced as free and ngram ran at 0.8x AR under load)."""
    noisy = CostTable(contexts=(100,), seconds=((1.0, 1.3, 1.9, 1.6, 1.4),))
    priced = [rows_seconds(noisy, 100, r) for r in range(1, 12)]
    assert priced[:5] == [1.0, 1.3, 1.9, 1.9, 1.9]
    assert priced[5:] == pytest.approx([1.9 + n * (1.9 - 1.0) / 4 for n in range(1, 7)])
    assert priced == sorted(priced)
    assert OneForward((1.0, 1.2, 1.1)).seconds(noisy, [(100, 1), (100, 1), (100, 1)]) == 1.2


def test_separate_forwards_add_up_and_one_forward_prices_its_rows():
    parts = [(100, 1), (100, 3)]
    assert SeparateForwards().seconds(TABLE, parts) == pytest.approx(1.0 + 1.6)
    by_rows = (1.0, 1.05, 1.1, 1.15, 1.2, 1.25)
    assert OneForward(by_rows).seconds(TABLE, parts) == pytest.approx(1.15)


@pytest.mark.parametrize("costs", [SeparateForwards(), OneForward((1.0, 1.05, 1.1, 1.2, 1.4)),
                                   OneForward()])  # fmt: skip
def test_a_growing_answer_is_priced_as_the_whole_step_would_be(costs):
    """`growing` works the others' part out once (pricing every answer every step was a
    fifth of a step at 8 answers); it must say what `seconds` says of each whole step."""
    table = CostTable(contexts=(100, 900), seconds=(STEPS, tuple(s + 0.4 for s in STEPS)))
    others = [(100, 1), (500, 1), (900, 4)]
    for context in (100, 300, 1200):
        got = costs.growing(table, others, context, 6)
        want = [costs.seconds(table, [*others, (context, 1 + n)]) for n in range(7)]
        assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("costs", [SeparateForwards(), OneForward((1.0, 1.05, 1.1, 1.2, 1.4))])
def test_the_prices_make_the_schedulers_rule_the_batchs(costs):
    """E(k) / P(k) > 1 / P(0) exactly when the tokens k drafts add per second they add
    beat the batch's own rate: (E - 1) / X(k) > m / T."""
    others = [(100, 1), (100, 1), (100, 4)]  # two plain rows and a verify of 3 drafts
    m = 3 + 1  # answers getting a token, this one included
    prices = batch_prices(TABLE, costs, 100, others, producing=3)
    plain = costs.seconds(TABLE, [*others, (100, 1)])
    for k, expected in itertools.product(range(1, 5), (1.05, 1.3, 1.8, 2.5, 3.9)):
        extra = costs.seconds(TABLE, [*others, (100, 1 + k)]) - plain
        scheduler_says = expected / prices[k] > 1 / prices[0]
        batch_says = (expected - 1) / extra > m / plain
        assert scheduler_says == batch_says, (k, expected)


def _learnt(accepted: list[int], drafts: int = 4) -> VerifyScheduler:
    """A cost-policy scheduler that has seen drafts of `drafts` tokens accept `accepted`
    (in turn)."""
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), TABLE)
    for i in range(40):
        draft = Draft(tokens=torch.zeros(1, drafts, dtype=torch.long), source="d")
        scheduler.record(draft, accepted[i % len(accepted)])
    return scheduler


def test_a_draft_that_pays_alone_may_not_pay_in_a_batch():
    """llama.cpp's measurement (speculation doubles one slot and loses at 2 and 4): a
    first draft accepted half the time pays alone, where the plain step is all memory
    reads and the row it adds costs 0.3 of it, but not beside three answers whose rows
    already share those reads; with rows nearly free it pays again."""
    option = (DraftOption(0, source="d"),)
    assert _learnt([0, 1]).pick(option, 100) == 0  # 1.5 tokens for 1.35: it pays alone
    rows = OneForward((1.0, 1.3, 1.6, 1.9, 2.2, 2.5, 2.8, 3.1))  # each row 0.3 more
    shared = _learnt([0, 1])
    shared.step_prices = batch_prices(TABLE, rows, 100, [(100, 1)] * 3, 3)
    assert shared.pick(option, 100) is None  # 4 tokens for 1.9 beats 4.5 for 2.25
    free = OneForward((1.0, 1.01, 1.02, 1.03, 1.04, 1.05, 1.06, 1.07))
    cheap = _learnt([0, 1])
    cheap.step_prices = batch_prices(TABLE, free, 100, [(100, 1)] * 3, 3)
    assert cheap.pick(option, 100) == 0
    # separate forwards add up: the batch's rate is one answer's, and so is the decision
    apart = _learnt([0, 1])
    apart.step_prices = batch_prices(TABLE, SeparateForwards(), 100, [(100, 1)] * 3, 3)
    assert apart.pick(option, 100) == 0


@pytest.fixture(scope="module")
def model(tiny_llama):
    return load_target(tiny_llama, dtype=torch.float32, device="cpu")


def _decoding(model, scheduler, params=None, drafter=True) -> Stepper:
    """An answer past its prefill, with an oracle drafter (or none: plain decoding)."""
    session = Session(model, 64, OracleDrafter(model) if drafter else None, scheduler)
    stepper = Stepper(session, [5, 17, 42, 99], params=params or SamplingParams(),
                      max_new_tokens=30,
                      stop_ids=frozenset())  # fmt: skip
    while stepper.prefilling:
        stepper.finish(session.forward(torch.tensor([stepper.plan().tokens]), session.cache,
                                       num_logits=1))  # fmt: skip
    return stepper


def _prices_seen(batch: Batch, steppers: list[Stepper]) -> list:
    """The prices each stepper's scheduler held when it planned this step, in order."""
    seen: dict[int, list[float] | None] = {}
    for s in steppers:

        def plan(original=s.plan, stepper=s):
            scheduler = stepper.scheduler
            seen[id(stepper)] = None if scheduler is None else scheduler.step_prices
            return original()

        s.plan = plan
    batch.step(steppers)
    return [seen[id(s)] for s in steppers]


def test_the_batch_hands_shared_prices_to_cost_schedulers_only(model):
    batch = Batch()
    alone = _decoding(model, _learnt([2]))
    assert _prices_seen(batch, [alone]) == [None]  # alone: the table's own
    pair = [_decoding(model, _learnt([2])), _decoding(model, None, drafter=False)]
    contexts = [s.context for s in pair]
    seen = _prices_seen(batch, pair)
    assert seen[1] is None
    assert seen[0] == batch_prices(TABLE, SeparateForwards(), contexts[0], [(contexts[1], 1)], 1)
    seeded = [_decoding(model, _learnt([2]), SamplingParams(temperature=0.7, seed=1)),
              _decoding(model, _learnt([2]))]  # fmt: skip
    assert _prices_seen(batch, seeded)[0] is None  # a seeded answer decides as if alone
    assert all(s.scheduler.step_prices is None for s in [pair[0], *seeded])  # handed back


def test_one_forward_prices_its_rows_from_the_table_by_default():
    parts = [(100, 1), (100, 3), (100, 2)]  # six rows: one past the table's five
    assert OneForward().seconds(TABLE, parts) == pytest.approx(2.2 + 0.3)
    longer = CostTable(contexts=(100, 1100), seconds=(STEPS, tuple(s + 0.5 for s in STEPS)))
    # one answer's rows at 1100 tokens of context add their attention there
    assert OneForward().seconds(longer, [(100, 1), (1100, 2)]) == pytest.approx(1.6 + 2 * 0.5)
