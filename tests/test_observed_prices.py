"""Step prices corrected by the forwards that ran (scheduling/observed.py): the scheduler
decides by what verify blocks cost as the answers run them, not only by the table."""

from __future__ import annotations

import pytest
import torch

from specgen.core.config import SamplingParams, VerifyPolicy
from specgen.core.draft import Draft, DraftOption
from specgen.scheduling.cost import CostTable
from specgen.scheduling.learning import Schedulers
from specgen.scheduling.observed import MIN_SAMPLES, MOVE, REFRESH, WINDOW, ObservedPrices
from specgen.scheduling.scheduler import VerifyScheduler


def test_each_verify_length_is_scaled_by_the_median_of_its_last_ratios():
    seen = ObservedPrices()
    table = CostTable(contexts=(100,), seconds=((1.0, 1.2, 1.5, 1.4, 1.6),))
    assert seen.corrected(table) is table  # nothing seen: the table
    for seconds in (1.5, 1.4, 9.0):  # one outlier among three
        seen.record(0, seconds, 1.0)
    assert seen.ratio(0) == 1.5
    for _ in range(MIN_SAMPLES - 1):
        seen.record(3, 5.0, 2.0)
    assert seen.ratio(3) == 1.5  # too few of its own yet: the nearest seen length's
    seen.record(3, 5.0, 2.0)
    assert seen.ratio(3) == 2.5
    assert seen.ratio(1) == pytest.approx(1.5 + (2.5 - 1.5) / 3)  # between: on the line
    fixed = seen.corrected(table)
    assert fixed.step_seconds(100) == pytest.approx([1.5, 2.2, 3.25, 3.5, 4.0])
    assert seen.corrected(table) is fixed  # kept until a median moves
    for _ in range(WINDOW):  # the machine got faster: only the last WINDOW count
        seen.record(0, 1.0, 1.0)
    assert seen.ratio(0) == 1.0
    for _ in range(MIN_SAMPLES):  # a clock that did not move, or no price: nothing
        seen.record(1, 0.0, 1.0)
        seen.record(1, 1.0, 0.0)
    assert seen.ratio(1) == pytest.approx(1.0 + (2.5 - 1.0) / 3)  # still on the line


def test_a_longer_verify_is_never_priced_below_a_shorter_one():
    """Each length's ratio is its own steps' median; on a busy machine neighbouring lengths'
    differ by more than a row costs, which once priced 6 rows above 8 and made drafting
    more look cheaper than drafting less."""
    seen = ObservedPrices()
    table = CostTable(contexts=(100, 1000), seconds=((1.0, 1.1, 1.2, 1.3), (2.0, 2.2, 2.4, 2.6)))
    for verify, ratio in ((0, 1.0), (1, 2.0), (2, 1.0), (3, 1.1)):
        for _ in range(MIN_SAMPLES):
            seen.record(verify, ratio, 1.0)
    fixed = seen.corrected(table)
    assert fixed.step_seconds(100) == pytest.approx([1.0, 2.2, 2.2, 2.2])
    assert fixed.step_seconds(1000) == pytest.approx([2.0, 4.4, 4.4, 4.4])


def test_a_median_that_barely_moves_does_not_make_the_schedulers_price_again():
    seen = ObservedPrices()
    for _ in range(MIN_SAMPLES):
        seen.record(0, 1.2, 1.0)
    version = seen.version
    for _ in range(4 * REFRESH):  # ratios within the tolerance: the median stays
        seen.record(0, 1.2 * (1 + MOVE / 2), 1.0)
    assert seen.version == version and seen.ratio(0) == 1.2
    for _ in range(WINDOW):  # a real move is taken at a refresh
        seen.record(0, 1.5, 1.0)
    assert seen.version > version and seen.ratio(0) == 1.5


def test_drafting_stops_when_verify_blocks_run_dearer_than_the_table_says():
    # the table: 4 rows cost 1.2 plain steps, so drafts accepted 40% of the time pay
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.1, 1.15, 1.2),), drafts={"d": (0.05,)})
    one = (DraftOption(),)

    def learnt(observed: ObservedPrices | None) -> VerifyScheduler:
        scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
        scheduler.observed = observed
        for _ in range(40):
            draft = Draft(tokens=torch.zeros(1, 3, dtype=torch.long))
            scheduler.record(draft, accepted=1)  # 1 of 3 accepted: τ 2 for 3 drafts
        return scheduler

    assert learnt(None).pick(one, 100) == 0  # the table alone: drafting pays
    seen = ObservedPrices()
    scheduler = learnt(seen)
    for _ in range(MIN_SAMPLES):  # as the steps ran: plain steps as priced, 2 rows at 2.2
        scheduler.timed(100, 0, 1.0)
        scheduler.timed(100, 1, 2.2)
    assert scheduler.pick(one, 100) is None  # a plain step (a probe aside)
    assert learnt(seen).pick(one, 100) is None  # the pipeline's record: every new answer's


def test_probes_are_paced_by_what_drafting_them_took():
    """A probe's draft first catches the drafter up on the plain steps it skipped, which
    the table's draft price leaves out: once probes are seen to take longer, they come
    further apart, so that they still cost the budget they are paced by."""
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.5, 1.9, 2.2),), drafts={"d": (0.2,)})
    one = (DraftOption(),)

    def probes(seconds: float | None, steps: int = 4000) -> int:
        scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
        scheduler.observed = ObservedPrices()
        made = 0
        for _ in range(steps):
            _, room = scheduler.plan(one, 100, 3)
            if room == 0:
                continue
            made += 1
            if seconds is not None:
                scheduler.drafted(seconds)
            draft = scheduler.trim(Draft(tokens=torch.zeros(1, room, dtype=torch.long)), 100)
            assert draft.probe  # nothing accepted ever: drafting never pays on merit
            scheduler.record(draft, accepted=0)
        return made

    as_priced, dearer = probes(None), probes(10.0)
    assert as_priced > 0 and dearer > 0
    assert as_priced > 4 * dearer  # a probe 50x dearer than priced: far fewer of them
    assert probes(0.01) == as_priced  # cheaper than the table says: the table's pace


def test_seeded_answers_keep_the_tables_prices():
    """A seeded sampling answer's draws depend on its verify lengths, so what the machine
    happened to run must not enter them; every other answer shares the pipeline's record."""
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.2),), drafts={"d": (0.1,)})
    schedulers = Schedulers(VerifyPolicy.parse("cost"), costs, drafters=1)
    a, b = schedulers.new(), schedulers.new()
    assert a.observed is schedulers.observed and b.observed is schedulers.observed
    seeded = schedulers.for_answer(a, SamplingParams(temperature=0.7, seed=3))
    assert seeded.observed is None
    assert seeded._steps(100) == [1.0, 1.2]
    seeded.timed(100, 0, 5.0)  # nothing recorded
    assert schedulers.observed.ratio(0) is None
    for _ in range(MIN_SAMPLES):
        a.timed(100, 1, 2.4)
    assert b._steps(100) == pytest.approx([1.0, 2.4])
    again = CostTable(contexts=(100,), seconds=((1.0, 2.0),), drafts={"d": (0.1,)})
    schedulers.reprice(again, a, seeded)
    assert a.observed is schedulers.observed and a.observed.ratio(1) is None  # a new table
    assert a.costs is again and schedulers.new().costs is again
    # b was not named (an idle session's, or another answer's in the batch): it too prices
    # by the new table and keeps its steps in the one new record
    assert b.costs is again and b.observed is schedulers.observed
    # measured again mid-process (engine/costs.CostWatch): seeded answers keep deciding from
    # the table as first given, the running one and every later one, so a seed repeats
    assert seeded.costs is costs
    later = schedulers.for_answer(a, SamplingParams(temperature=0.7, seed=3))
    assert later.costs is costs and later._steps(100) == [1.0, 1.2]


def test_the_loop_times_its_forwards_against_a_measured_table_only(
    tiny_qwen3_deep, tiny_dflash, tmp_path, monkeypatch
):
    """A table measured here is corrected by the forwards as they run; prices handed in
    (tests, what-if runs with another machine's) are taken as they are, never second-
    guessed, so a replay of the loop's decisions over them stays exact."""
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig

    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))  # a table measured for this test
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(drafter=str(tiny_dflash), verify_policy="cost")
    want = ar.generate("The quick brown fox", raw=True, max_new_tokens=24).token_ids
    costs = CostTable(contexts=(1,), seconds=((1e-3,) * 8,), drafts={"dflash": (1e-4,)})
    given = ar.with_spec(spec, costs=costs)
    assert given.generate("The quick brown fox", raw=True, max_new_tokens=24).token_ids == want
    assert given.schedulers.observed is None and given.new_session().scheduler.observed is None
    measured = ar.with_spec(spec)
    got = measured.generate("The quick brown fox", raw=True, max_new_tokens=24)
    assert got.token_ids == want
    assert measured.schedulers.observed.ratio(0) is not None


def test_steps_answers_share_are_timed_as_one_forward_of_all_their_rows():
    """engine/batch.py keeps each step's forward time against the table's price for all
    its rows, under its rows less one: one forward of 3 rows is what a verify of 2 drafts
    runs. Not a step with a prefill chunk, nor answers' separate forwards."""
    from types import SimpleNamespace

    from specgen.engine.batch import Batch
    from specgen.scheduling.batch import OneForward, SeparateForwards

    costs = CostTable(contexts=(100,), seconds=((1.0, 1.1, 1.2, 1.3),))
    schedulers = Schedulers(VerifyPolicy.parse("cost"), costs, drafters=1)
    one, seeded = schedulers.new(), schedulers.new(learn=False)

    def step(batch, rows, prefill=False, first=seeded):
        planned = [(SimpleNamespace(scheduler=s), SimpleNamespace(prefill=prefill))
                   for s in (first, *[one] * (len(rows) - 1))]  # fmt: skip
        for _ in range(MIN_SAMPLES):
            batch._observe(planned, [(100, r) for r in rows], 2.4)

    step(Batch(OneForward()), [1, 2])  # 3 rows for 1.2 s priced: twice the table
    assert schedulers.observed.ratio(2) == pytest.approx(2.0)
    step(Batch(OneForward()), [1, 1], prefill=True)
    step(Batch(SeparateForwards()), [1, 1])
    step(Batch(OneForward()), [2, 3])  # 5 rows: longer than the table's longest verify
    assert schedulers.observed.ratio(1) is None and schedulers.observed.ratio(3) == 2.0
