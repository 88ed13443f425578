"""The verify-length decision and the acceptance estimates behind it (pure functions)."""

from __future__ import annotations

import pytest
import torch

from specgen.core.draft import Draft
from specgen.scheduling.verify_length import choose_verify_length


def test_everything_accepted_and_cheap_verification_takes_all():
    decision = choose_verify_length([1.0] * 5, step_seconds=[1.0] * 6)
    assert decision.length == 5 and decision.expected_tokens == 6.0


def test_hopeless_drafts_are_not_verified():
    assert choose_verify_length([0.0, 0.0], step_seconds=[1.0, 1.2, 1.4]).length == 0


def test_stops_at_the_first_slot_that_does_not_pay():
    # slot 2 lowers tokens/s, so admission stops there although a global argmax over the
    # (jagged) costs would take all three
    conditional = [0.9, 0.1, 1.0]
    costs = [1.0, 1.1, 1.6, 1.15]
    assert (1 + 0.9 + 0.09 + 0.09) / 1.15 > 1.9 / 1.1
    decision = choose_verify_length(conditional, step_seconds=costs)
    assert decision.length == 1
    assert decision.expected_rate == pytest.approx(1.9 / 1.1)


def test_expensive_verification_needs_high_acceptance():
    costs = [1.0, 1.5]
    assert choose_verify_length([0.4], step_seconds=costs).length == 0
    assert choose_verify_length([0.6], step_seconds=costs).length == 1


@pytest.mark.parametrize(
    "conditional, costs",
    [([0.5], [1.0]), ([1.2], [1.0, 1.0]), ([0.5], [1.0, 0.0])],
)
def test_bad_inputs_are_refused(conditional, costs):
    with pytest.raises(ValueError):
        choose_verify_length(conditional, step_seconds=costs)


def test_cost_table_interpolates_in_the_context():
    from specgen.scheduling.cost import CostTable

    table = CostTable(contexts=(100, 1100), seconds=((1.0, 2.0), (2.0, 4.0)))
    assert table.step_seconds(100) == [1.0, 2.0]
    assert table.step_seconds(600) == pytest.approx([1.5, 3.0])
    assert table.step_seconds(2100) == pytest.approx([3.0, 6.0])  # extrapolated
    assert table.max_drafts == 1


def test_measured_costs_are_cached(tiny_llama, monkeypatch):
    import torch

    from specgen.engine import costs as cost
    from specgen.models.loading import load_target

    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    first = cost.target_costs(model, "tiny", 3)
    assert first.max_drafts == 3 and all(s > 0 for row in first.seconds for s in row)
    monkeypatch.setattr(cost, "measure_costs", lambda *a, **k: pytest.fail("measured twice"))
    cut = cost.CostTable(first.contexts, tuple(row[:3] for row in first.seconds))
    assert cost.target_costs(model, "tiny", 2) == cut  # cut to the longest draft asked for
    # graphs only change how a CUDA session's steps run: on the CPU, the same table
    assert cost.target_costs(model, "tiny", 2, graphs=True) == cut


@pytest.mark.parametrize("graphs", [True, False])
def test_verify_costs_are_measured_the_way_steps_run(tiny_qwen3_deep, tiny_dflash, graphs):
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig
    from specgen.engine import costs as cost

    seen = []
    real = cost.cached_costs

    def spy(*args, **kwargs):
        seen.append(kwargs.get("graphs"))
        return real(*args, **kwargs)

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("specgen.api.loader.cached_costs", spy)
        spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), cuda_graphs=graphs)
        ar.with_spec(spec)
    assert seen == [graphs]


def test_drafting_is_skipped_only_when_no_verify_length_pays():
    from specgen.scheduling.verify_length import best_draft

    def worth_drafting(conditional, *, step_seconds, draft_seconds) -> bool:
        plan = best_draft(conditional, step_seconds=step_seconds, draft_seconds=draft_seconds)
        rate = plan.expected_rate
        return rate > 1.0 / step_seconds[0]  # beats a plain decoding step

    steps = [1.0, 1.2, 1.5, 2.4]
    assert worth_drafting([0.9, 0.9, 0.9], step_seconds=steps, draft_seconds=0.5)
    assert not worth_drafting([0.3, 0.3, 0.3], step_seconds=steps, draft_seconds=0.5)
    # the same acceptance pays with a free drafter: 1.3 tokens for 1.2x the time
    assert worth_drafting([0.3, 0.3, 0.3], step_seconds=steps, draft_seconds=0.0)


def test_a_skipping_scheduler_probes_with_a_growing_interval():
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import (
        PROBE_AFTER,
        PROBE_BUDGET,
        PROBE_LENGTH,
        VerifyScheduler,
    )

    one = (DraftOption(),)
    cheap = CostTable(contexts=(100,), seconds=((1.0, 1.1, 1.2, 1.3),), drafts={"d": (0.1,)})
    assert VerifyScheduler(VerifyPolicy.parse("cost"), cheap).pick(one, 100) == 0  # the prior
    # this CPU's costs: drafting pays only above the prior's acceptance, so only probes draft
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.2, 1.5, 2.4),), drafts={"d": (0.5,)})
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    assert scheduler.prices_drafts
    draft = Draft(tokens=torch.zeros(1, 3, dtype=torch.long))

    def skips_before_a_probe() -> int:
        count = 0
        while scheduler.pick(one, 100) is None:
            scheduler.skipped()
            count += 1
        return count

    assert skips_before_a_probe() == PROBE_AFTER
    probe = scheduler.trim(Draft(tokens=torch.zeros(1, 7, dtype=torch.long)), 100)
    assert probe.length == PROBE_LENGTH  # verified whatever the estimates say
    scheduler.record(probe, accepted=0)  # a failed probe: the next one comes later
    assert skips_before_a_probe() == 2 * PROBE_AFTER
    scheduler.record(scheduler.trim(draft, 100), accepted=1)  # drafts accepted, yet not
    assert skips_before_a_probe() == 2 * PROBE_AFTER  # paying: probes keep their pace
    scheduler.record(scheduler.trim(draft, 100), accepted=0)
    for _ in range(6):
        gap = skips_before_a_probe()
        scheduler.record(scheduler.trim(draft, 100), accepted=0)
    # capped where a probe's extra cost (draft + 4-token forward - 1-token forward) is
    # PROBE_BUDGET of the plain steps between probes
    assert gap == round((0.5 + 2.4 - 1.0) / (PROBE_BUDGET * 1.0)) == 95
    for _ in range(40):  # drafts that pay: on merit, and the probes' pace starts over
        scheduler.record(Draft(tokens=torch.zeros(1, 3, dtype=torch.long)), accepted=3)
    assert scheduler.pick(one, 100) == 0 and not scheduler.trim(draft, 100).probe
    for _ in range(40):
        scheduler.record(scheduler.trim(draft, 100), accepted=0)
    assert skips_before_a_probe() == PROBE_AFTER
    assert not VerifyScheduler(VerifyPolicy.parse("full")).prices_drafts  # only cost skips


def _history(scheduler, bucket: int, accepted: int, steps: int = 30) -> None:
    """`steps` finished drafts of `bucket` (drafter "ab"[bucket]), 4 verified, `accepted`
    of them accepted."""
    for _ in range(steps):
        draft = Draft(
            tokens=torch.zeros(1, 4, dtype=torch.long), bucket=bucket, source="ab"[bucket]
        )
        scheduler.record(draft, accepted)


def test_the_scheduler_picks_the_faster_option_or_none():
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import VerifyScheduler

    seconds = ((1.0, 1.2, 1.5, 1.7, 2.0),)
    two = (DraftOption(0, source="a"), DraftOption(1, source="b"))

    def picks(accepted_a: int, accepted_b: int, drafts=(0.3, 0.9)) -> int | None:
        costs = CostTable((100,), seconds, {"a": (drafts[0],), "b": (drafts[1],)})
        scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
        _history(scheduler, 0, accepted_a)
        _history(scheduler, 1, accepted_b)
        return scheduler.pick(two, 100)

    assert picks(4, 0) == 0
    assert picks(0, 4) == 1  # the slower drafter, when it is the one accepted
    assert picks(3, 3) == 0  # equal acceptance: the cheaper one
    assert picks(0, 0) is None  # neither pays: a plain step
    # the drafter's own time decides: drafter 1 at a third of the cost now wins
    assert picks(3, 3, drafts=(0.9, 0.3)) == 1


@pytest.mark.slow
def test_skipped_drafts_keep_the_output_exact(tiny_qwen3_deep, tiny_dflash):
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig
    from specgen.scheduling.cost import CostTable

    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    want = base.generate("The quick brown fox", raw=True, max_new_tokens=40).token_ids
    # a random drafter is rarely right, and here drafting costs as much as a verify step
    costs = CostTable(contexts=(1,), seconds=((1.0,) + (1.1,) * 7,), drafts={"dflash": (1.0,)})
    spec = SpecConfig(drafter=str(tiny_dflash), verify_policy="cost", trace=True)
    pipe = base.with_spec(spec, costs=costs)
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=40)
    assert got.token_ids == want
    trace = got.stats.trace[1:]
    assert trace[0]["draft"]  # the prior drafts first
    assert sum(1 for r in trace if not r["draft"]) > len(trace) // 2  # then mostly skips


def test_confidence_drafts_trimmed_to_nothing_stop_being_drafted():
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import VerifyScheduler

    costs = CostTable(contexts=(100,), seconds=((1.0, 1.1, 1.2, 1.3),), drafts={"d": (0.1,)})
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    one = (DraftOption(),)
    low = Draft(tokens=torch.zeros(1, 3, dtype=torch.long), confidence=torch.full((1, 3), 0.01))
    assert scheduler.pick(one, 100) == 0  # the prior pays here
    for _ in range(30):
        trimmed = scheduler.trim(low, 100)
        assert trimmed.length == 0  # its confidences say: verify nothing
        scheduler.record(trimmed, accepted=0, proposed=low.length)
    assert scheduler.pick(one, 100) is None  # drafting it stopped paying


def test_a_new_session_starts_from_what_the_last_answer_learnt(tiny_qwen3_deep, tiny_dflash):
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    pipe = ar.with_spec(SpecConfig(method="dflash", drafter=str(tiny_dflash)))
    assert pipe.new_session().scheduler.history.buckets == {}  # nothing learnt yet: the prior
    first = pipe.new_session()
    pipe.generate("one two one two one two", max_new_tokens=40, session=first)
    learnt = first.scheduler
    assert pipe.schedulers.learnt is learnt and learnt.history.buckets  # it drafted and recorded
    second = pipe.new_session()
    assert second.scheduler.history == learnt.history
    assert second.scheduler.history is not learnt.history  # a copy: sessions stay apart
    assert second.scheduler.probes.after == learnt.probes.after
    text = "The quick brown fox"
    want = ar.generate(text, max_new_tokens=30).token_ids
    assert pipe.generate(text, max_new_tokens=30, session=second).token_ids == want


def test_a_confidence_drafter_is_priced_by_its_steps_as_verified():
    """Stacked's pick between DFlash (no confidences) and DSpark (confidence-trimmed).
    Half of the confident drafter's steps verify 3 drafts and commit 4 tokens, half verify
    none: per position its rates are [0.5, 1, 1], which priced as a fixed verify length
    give (1 + 3 x 0.5) / (0.5 + 1.8) = 1.09 tokens/s. Its steps as verified give
    (4 + 1) / ((0.5 + 1.8) + (0.5 + 1.0)) = 1.32. The other drafter, verified whole at
    rates [0.55, 1, 1], gives (1 + 3 x 0.55) / 2.3 = 1.15."""
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import VerifyScheduler

    costs = CostTable(contexts=(100,), seconds=((1.0, 1.2, 1.5, 1.8),), drafts={"d": (0.5,)})
    options = (DraftOption(0), DraftOption(1, confidences=True))
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    tokens = torch.zeros(1, 3, dtype=torch.long)
    sure = Draft(tokens=tokens, confidence=torch.full((1, 3), 0.99), bucket=1)
    unsure = Draft(tokens=tokens, confidence=torch.full((1, 3), 0.01), bucket=1)
    plain = Draft(tokens=tokens, bucket=0)
    for step in range(40):
        scheduler.record(plain, accepted=3 if (step * 11) % 20 < 11 else 0)  # 55%, spread
        if step % 2:
            scheduler.record(sure, accepted=3, proposed=3)
        else:
            scheduler.record(unsure.truncated(0), accepted=0, proposed=3)
    # each pulled in a little towards the one before it (the first towards the prior, 0.6)
    rates = scheduler.history.rates(1, 3)
    assert rates[:2] == pytest.approx([0.5, 0.92], abs=0.03) and rates[1] < rates[2] < 1
    from specgen.scheduling.history import StepHistory
    from specgen.scheduling.verify_length import best_draft

    by_rates = [
        best_draft(scheduler.history.rates(b, 3), step_seconds=costs.seconds[0],
                   draft_seconds=0.5).expected_rate
        for b in (0, 1)
    ]  # fmt: skip
    assert by_rates[0] > by_rates[1]  # priced by its rates it would lose
    assert scheduler.pick(options, 100) == 1  # by its steps, not by its rates
    realised = scheduler.history.rate(1, step_seconds=costs.seconds[0], draft_seconds=0.5)
    assert realised == pytest.approx(5 / 3.8, rel=0.03)
    # a drafter without confidences keeps its per-position price; so does one not yet seen
    assert scheduler.price(DraftOption(0), 100) == pytest.approx(by_rates[0])
    fresh = StepHistory(3)
    fresh.record(1, proposed=3, verified=3, judged=3, accepted=3)
    assert fresh.rate(1, step_seconds=costs.seconds[0], draft_seconds=0.5) is None  # 1 step
    # and by its steps, a confident drafter that keeps verifying nothing does not pay
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    for _ in range(10):
        scheduler.record(unsure.truncated(0), accepted=0, proposed=3)
    assert scheduler.pick((DraftOption(1, confidences=True),), 100) is None


def test_stacked_drafters_are_compared_by_their_own_last_steps():
    """Stacked under the cost policy (GPU-like prices): each drafter is judged by the tokens
    per second of its own last steps (OwnSteps), which the other drafter's steps do not
    fade. DSpark (confidences) drafted passably, then DFlash better, then DFlash worse than
    DSpark had: DSpark is tried again then, and not before."""
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import SWITCH_MARGIN, VerifyScheduler

    drafts = {"dflash": (0.3,), "dspark": (0.3,)}
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.01, 1.02, 1.03),), drafts=drafts)
    options = (DraftOption(0, "dflash"), DraftOption(1, "dspark", confidences=True))
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    steps = costs.seconds[0]
    tokens = torch.zeros(1, 3, dtype=torch.long)
    paid = lambda k: 0.3  # noqa: E731
    for _ in range(6):  # DSpark: 2 tokens per 1.33 s
        confident = Draft(tokens=tokens, confidence=torch.full((1, 3), 0.9), bucket=1,
                          source="dspark")  # fmt: skip
        scheduler.record(confident, accepted=1, proposed=3)
    dspark = scheduler.history.own_rate(1, step_seconds=steps, draft_cost=paid)
    assert dspark == pytest.approx(2 / 1.33)
    plain = Draft(tokens=tokens, bucket=0, source="dflash")
    for _ in range(10):  # DFlash: 4 tokens per 1.33 s
        scheduler.record(plain, accepted=3)
    assert scheduler.pick(options, 100) == 0
    for i in range(30):  # DFlash worsens: 1 token per step
        scheduler.record(plain, accepted=0)
        own = scheduler.history.own_rate(0, step_seconds=steps, draft_cost=paid)
        assert scheduler.history.own_rate(1, step_seconds=steps, draft_cost=paid) == dspark
        expected = 1 if dspark > own * (1 + SWITCH_MARGIN) else 0
        assert scheduler.pick(options, 100) == expected, i
    assert expected == 1  # in the end DSpark drafts again


def test_the_drafter_drafting_keeps_drafting_unless_another_is_clearly_faster():
    """Stacked: the drafter not drafting has an older estimate, so a few percent in its
    favour is mostly noise; switching on it cost more than it won under GPU-like prices
    (benchmarks/results/cpu-replay-stacked-selectors.txt). The incumbent keeps drafting
    unless the other is expected SWITCH_MARGIN faster by their own last steps."""
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import SWITCH_MARGIN, VerifyScheduler

    drafts = {"a": (0.3,), "b": (0.3,)}
    costs = CostTable(contexts=(100,), seconds=((1.0, 1.01, 1.02, 1.03),), drafts=drafts)
    tokens = torch.zeros(1, 3, dtype=torch.long)
    options = (DraftOption(0, "a"), DraftOption(1, "b"))

    def after(misses: tuple[int, ...]) -> tuple[int | None, float]:
        """Both drafted in turn, drafter 0 last; it missed where drafter 1 did not at
        `misses`. Returns the pick and drafter 1's expected rate over drafter 0's."""
        scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
        for i in range(40):
            scheduler.record(Draft(tokens=tokens, bucket=1, source="b"), accepted=1 if i % 2 else 3)
            scheduler.record(Draft(tokens=tokens, bucket=0, source="a"),
                             accepted=1 if i % 2 or i in misses else 3)  # fmt: skip
        rate = [
            scheduler.history.own_rate(b, step_seconds=costs.seconds[0], draft_cost=lambda k: 0.3)
            for b in (0, 1)
        ]
        return scheduler.pick(options, 100), rate[1] / rate[0]

    pick, edge = after((30,))
    assert 1 < edge < 1 + SWITCH_MARGIN and pick == 0  # a small edge: drafter 0 stays
    pick, edge = after((36, 38))
    assert edge > 1 + SWITCH_MARGIN and pick == 1  # a clear one: drafter 1 takes over


def test_draft_length_is_settled_before_drafting_from_per_length_costs():
    from specgen.core.config import VerifyPolicy
    from specgen.core.draft import DraftOption
    from specgen.scheduling.cost import CostTable
    from specgen.scheduling.scheduler import PROBE_LENGTH, VerifyScheduler
    from specgen.scheduling.verify_length import best_draft, best_verify_length

    steps = (1.0, 1.2, 1.6, 1.5)  # (as on this CPU: verifying 3 costs less than 2)
    rates = [0.8, 0.5, 0.9]
    # one draft time for every length: the longest draft is best (2.62 tokens / 2.0 s)
    assert best_draft(rates, step_seconds=steps, draft_seconds=0.5).length == 3
    # a drafter whose time grows with the tokens it drafts: 1.8 / 1.4 beats 2.62 / 2.4
    plan = best_draft(rates, step_seconds=steps, draft_seconds=(0.2, 0.5, 0.9))
    assert plan.length == 1 and plan.expected_rate == pytest.approx(1.8 / 1.4)
    # after drafting, estimates from earlier steps may take the best length over all of
    # them: 3 here, where the slot-by-slot rule stops at 2 (it does not pay) and verifies 1
    assert best_verify_length(rates, step_seconds=steps, draft_seconds=0.5).length == 3
    assert best_verify_length([0.1], step_seconds=steps, draft_seconds=0.5).length == 0

    costs = CostTable(contexts=(100,), seconds=(steps,), drafts={"d": (0.2, 0.5, 0.9)})
    assert costs.draft_cost(1) == 0.2 and costs.draft_cost(9) == costs.draft_cost(0) == 0.9
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    for _ in range(30):  # first drafts mostly accepted, later ones rarely
        scheduler.record(Draft(tokens=torch.zeros(1, 3, dtype=torch.long)), accepted=1)
    plain, confident = DraftOption(0), DraftOption(0, confidences=True)
    assert scheduler.pick((plain,), 100) == 0 and scheduler.draft_length(7) == 1
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    for _ in range(30):  # every draft accepted: the longest draft pays best
        scheduler.record(Draft(tokens=torch.zeros(1, 3, dtype=torch.long)), accepted=3)
    assert scheduler.pick((plain,), 100) == 0 and scheduler.draft_length(7) == 3
    # confidences arrive with the draft and trim it: it drafts all it may
    assert scheduler.pick((confident,), 100) == 0 and scheduler.draft_length(7) == 7
    # a probe drafts what it verifies
    scheduler = VerifyScheduler(VerifyPolicy.parse("cost"), costs)
    for _ in range(30):
        scheduler.record(Draft(tokens=torch.zeros(1, 3, dtype=torch.long)), accepted=0)
    while scheduler.pick((plain,), 100) is None:
        scheduler.skipped()
    assert scheduler.draft_length(7) == PROBE_LENGTH


def test_costs_measured_again_mid_session_keep_the_shape_it_learnt_with(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, monkeypatch
):
    """The verify costs cached for a longer draft (another drafter's) are cut to this
    method's longest draft, so the table measured again when the steps drift (the machine
    got busy) has the shape the scheduler's history was sized by: a serve test once hit an
    IndexError when a 17-column cached table was replaced by a 16-column one mid-answer."""
    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig
    from specgen.engine import costs as cost

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    longer = cost.target_costs(ar.model, ar._cost_key, 20)  # cached by a longer drafter
    assert longer.max_drafts == 20
    spec = SpecConfig(
        method="stacked", drafter=(str(tiny_dflash), str(tiny_dspark)), verify_policy="full"
    )
    pipe = ar.with_spec(spec)
    want = pipe.method.max_draft_tokens
    assert pipe.costs.max_drafts == want < 20
    monkeypatch.setattr(cost.CostCheck, "stale", lambda self, stats, table: 3.0)  # drifted
    for prompt in ("The quick brown fox", "def add(a, b):", "one two one two"):
        session = pipe.new_session()
        for _ in range(2):
            pipe.generate(prompt, max_new_tokens=24, session=session)
    assert pipe.costs.max_drafts == want  # measured again, the same shape
