"""The stacked pipeline: both drafters on one target, one chooser, exact output."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig, VerifyPolicy
from specgen.core.draft import Draft, DraftOption
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import VerifyScheduler
from support.drafters import save_tiny_dspark
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB

runner = CliRunner()
STEPS = (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7)
OPTIONS = (DraftOption(0, "dflash"), DraftOption(1, "dspark"))


def _chooser(policy: str, drafts=(0.5, 0.5)) -> VerifyScheduler:
    """Stacked's scheduler under `policy`, with these draft times (AR steps)."""
    prices = {"dflash": (drafts[0],), "dspark": (drafts[1],)}
    return VerifyScheduler(VerifyPolicy.parse(policy), CostTable((1,), (STEPS,), prices))


def _history(scheduler: VerifyScheduler, tokens_a: int, tokens_b: int, steps: int = 12) -> None:
    """Drafters 0 and 1 drafted in turn, 4 tokens each, committing `tokens_a`/`tokens_b`."""
    for s in range(steps):
        chosen = s % 2
        draft = Draft(
            torch.zeros(1, 4, dtype=torch.long), bucket=chosen, source=OPTIONS[chosen].source
        )
        scheduler.record(draft, accepted=(tokens_a if chosen == 0 else tokens_b) - 1)


@pytest.mark.parametrize("policy", ["full", "threshold=0.5", "cost"])
def test_one_chooser_prefers_more_tokens_per_second_under_every_policy(policy):
    """Under every policy stacked's drafter is chosen the same way: by the tokens per
    second of each drafter's own recent steps at its own draft time."""
    scheduler = _chooser(policy)
    _history(scheduler, tokens_a=4, tokens_b=1)
    assert scheduler.plan(OPTIONS, 1, 4)[0] == 0
    scheduler = _chooser(policy)
    _history(scheduler, tokens_a=1, tokens_b=4)
    assert scheduler.plan(OPTIONS, 1, 4)[0] == 1
    # equal acceptance: the cheaper drafter wins
    scheduler = _chooser(policy, drafts=(0.9, 0.2))
    _history(scheduler, tokens_a=3, tokens_b=3)
    assert scheduler.plan(OPTIONS, 1, 4)[0] == 1


def test_only_the_cost_policy_skips_drafting():
    for policy in ("full", "threshold=0.5"):
        scheduler = _chooser(policy, drafts=(2.0, 2.0))  # drafting never pays here
        _history(scheduler, tokens_a=1, tokens_b=1)
        assert scheduler.plan(OPTIONS, 1, 4)[1] == 4  # every step drafts, all of it
    scheduler = _chooser("cost", drafts=(2.0, 2.0))
    _history(scheduler, tokens_a=1, tokens_b=1)
    assert scheduler.plan(OPTIONS, 1, 4) == (0, 0)  # a plain decoding step


def test_recent_steps_weigh_more():
    scheduler = _chooser("full")
    for s in range(30):
        draft = Draft(torch.zeros(1, 4, dtype=torch.long), bucket=0, source="dflash")
        scheduler.record(draft, accepted=4 if s < 15 else 0)
    rate = scheduler.history.own_rate(0, step_seconds=STEPS, draft_cost=lambda k: 0.5)
    assert rate * (0.5 + STEPS[4]) < 3.0  # the last 15 steps were poor (1 token each)


@pytest.fixture(scope="module")
def dspark_other_taps(tmp_path_factory):
    """A DSpark drafter tapping different target layers than the DFlash one."""
    return save_tiny_dspark(tmp_path_factory.mktemp("dspark-b") / "d", target_layer_ids=[0, 2, 4])


def _stacked(tiny_qwen3_deep, a, b, policy="cost", **kw):
    spec = SpecConfig(method="stacked", drafter=(str(a), str(b)), verify_policy=policy, **kw)
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)


def _priced(loaded: Pipeline, ar: Pipeline, draft: float, steps: tuple[float, ...]) -> Pipeline:
    """`loaded` (stacked) deciding from fixed prices, not this machine's measured ones:
    each draft `draft`, verifying n drafts steps[n]."""
    costs = CostTable(
        contexts=(1,), seconds=(steps,), drafts={n: (draft,) for n in loaded.drafters}
    )
    return ar.with_spec(loaded.spec, costs=costs)


@pytest.mark.parametrize("policy", ["cost", "full"])
def test_stacked_greedy_equals_ar(tiny_qwen3_deep, tiny_dflash, dspark_other_taps, policy):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    pipe = _stacked(tiny_qwen3_deep, tiny_dflash, dspark_other_taps, policy, trace=True)
    if policy == "cost":  # fixed prices (a GPU's), not this machine's noisy measurement:
        # which drafters get to draft must not depend on timing
        pipe = _priced(pipe, ar, 0.1, tuple(1.0 + 0.01 * n for n in range(8)))
    drafter = pipe.session.drafter
    assert drafter.taps == (0, 1, 2, 3, 4)  # one capture: the union of both drafters' layers
    used = set()
    for prompt in ("The quick brown fox", "def add(a, b):", "one two one two one two"):
        want = ar.generate(prompt, max_new_tokens=40, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=40, session=pipe.new_session())
        assert got.token_ids == want.token_ids
        used |= set(got.stats.by_drafter)
        assert {r["drafter"] for r in got.stats.trace[1:] if r["draft"]} <= {"dflash", "dspark"}
    assert used == {"dflash", "dspark"}  # both drafted at some point
    session = pipe.new_session()
    pipe.generate("The quick brown fox", max_new_tokens=20, session=session)
    for d in session.drafter.drafters:  # both context caches follow the target
        assert d.context.length == session.cache.length


def test_each_drafter_drafts_as_if_it_had_drafted_every_step(
    tiny_qwen3_deep, tiny_dflash, dspark_other_taps, monkeypatch
):
    """A drafter not chosen for a step must propose, when next chosen, what it would have
    had it drafted every step (as it does alone): its state may follow the committed
    tokens only, never its own earlier proposals. Drafters alternate; in the second run
    the one not chosen drafts too, and its draft is thrown away."""
    from specgen.methods.stacked.drafter import StackedDrafter

    original = StackedDrafter.propose
    pipe = _stacked(tiny_qwen3_deep, tiny_dflash, dspark_other_taps, "full")
    drafts = {}
    for shadow in (False, True):
        log: list[tuple[int, list[int]]] = []

        def propose(self, anchor, max_tokens, params, generator, shadow=shadow, log=log):
            chosen = (len(log) + 1) % 2
            if shadow:
                self.drafters[1 - chosen].propose(anchor, max_tokens, params, generator)
            self.select(chosen)
            draft = original(self, anchor, max_tokens, params, generator)
            log.append((draft.bucket, draft.tokens[0].tolist()))
            return draft

        monkeypatch.setattr(StackedDrafter, "propose", propose)
        pipe.generate("one two one two one two", max_new_tokens=30, session=pipe.new_session())
        drafts[shadow] = log
    assert {b for b, _ in drafts[False]} == {0, 1}
    assert drafts[True] == drafts[False]


def test_stacked_skips_drafting_when_neither_drafter_pays(
    tiny_qwen3_deep, tiny_dflash, dspark_other_taps
):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    want = ar.generate("The quick brown fox", raw=True, max_new_tokens=40).token_ids
    loaded = _stacked(tiny_qwen3_deep, tiny_dflash, dspark_other_taps, trace=True)
    # random drafters are rarely right, and here each costs as much as a verify step
    pipe = _priced(loaded, ar, 1.0, (1.0,) + (1.1,) * 7)
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=40)
    assert got.token_ids == want
    trace = got.stats.trace[1:]
    assert trace[0]["draft"]  # the prior drafts first
    assert sum(1 for r in trace if not r["draft"]) > len(trace) // 2  # then mostly skips


def test_stacked_stats_in_json(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    args = ["generate", "The quick brown fox", "--model", str(tiny_qwen3_deep), "--json",
            "--device", "cpu", "--dtype", "float32", "-n", "24",
            "--drafter", str(tiny_dflash), "--drafter", str(tiny_dspark)]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    stats = json.loads(result.stdout)["stats"]
    assert set(stats["drafters"]) <= {"dflash", "dspark"} and stats["drafters"]
    assert sum(d["steps"] for d in stats["drafters"].values()) <= stats["steps"]


def test_stacked_needs_two_distinct_drafters(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    with pytest.raises(CheckpointError, match="stacked got the same drafter twice"):
        _stacked(tiny_qwen3_deep, tiny_dflash, tiny_dflash)
    with pytest.raises(SpecgenError, match="--method stacked takes 2 or more --drafter, got 1"):
        spec = SpecConfig(method="stacked", drafter=str(tiny_dspark))
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=spec)
    with pytest.raises(SpecgenError, match="no stacked drafter is known"):
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=SpecConfig(method="stacked"))


def test_a_drafter_for_another_target_is_refused(tiny_qwen3_deep, tiny_dflash, tmp_path):
    other = save_tiny_dspark(tmp_path / "other", hidden=32, head_dim=8)
    with pytest.raises(CheckpointError, match="does not fit target"):
        _stacked(tiny_qwen3_deep, tiny_dflash, other)


@pytest.mark.statistical
def test_sampling_through_stacked_has_the_target_distribution(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark
):
    from support.statistics import exact_token_distribution

    pipe = _stacked(tiny_qwen3_deep, tiny_dflash, tiny_dspark, "full")
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, prompt, params, 2).float()
    counts, session, n = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3
