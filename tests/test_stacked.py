"""The stacked pipeline: both drafters on one target, a pure selector, exact output."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from conftest import TINY_VOCAB, chi_square_pvalue, save_tiny_dspark
from specgen.cli import app
from specgen.config import SamplingParams, SpecConfig
from specgen.errors import CheckpointError, SpecgenError
from specgen.pipeline import Pipeline
from specgen.scheduling.selector import DrafterRecord, choose_drafter, record_step

runner = CliRunner()
COSTS = {"draft_seconds": (0.5, 0.5), "step_seconds": (1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7)}


def test_selector_tries_each_drafter_first():
    records = (DrafterRecord(), DrafterRecord())
    assert choose_drafter(records, step=1, **COSTS) == 0
    records = record_step(records, 0, 1, committed=2, proposed=4)
    assert choose_drafter(records, step=2, **COSTS) == 1


def _history(tokens_a, tokens_b, steps=12):
    records = (DrafterRecord(), DrafterRecord())
    for s in range(steps):
        records = record_step(records, s % 2, s, tokens_a if s % 2 == 0 else tokens_b, 4)
    return records, steps


def test_selector_prefers_more_tokens_per_second():
    records, step = _history(tokens_a=4, tokens_b=1)
    assert choose_drafter(records, step=step, **COSTS) == 0
    records, step = _history(tokens_a=1, tokens_b=4)
    assert choose_drafter(records, step=step, **COSTS) == 1
    # equal acceptance: the cheaper drafter wins
    records, step = _history(tokens_a=3, tokens_b=3)
    costs = {**COSTS, "draft_seconds": (0.9, 0.2)}
    assert choose_drafter(records, step=step, **costs) == 1


def test_selector_explores_a_drafter_left_idle():
    records, step = _history(tokens_a=4, tokens_b=1)
    for s in range(step, step + 16):
        assert choose_drafter(records, step=s, **COSTS) == 0
        records = record_step(records, 0, s, 4, 4)
    assert choose_drafter(records, step=step + 16, **COSTS) == 1  # not tried for 17 steps


def test_recent_steps_weigh_more():
    records = (DrafterRecord(), DrafterRecord())
    for s in range(30):
        records = record_step(records, 0, s, 5 if s < 15 else 1, 4)
    assert records[0].expected_tokens() < 2.0  # the last 15 steps were poor


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
    from specgen.drafting.stacked import StackedMethod
    from specgen.scheduling.cost import CostTable

    method = StackedMethod(loaded.method.names, loaded.method.methods, (draft, draft), steps)
    costs = CostTable(contexts=(1,), seconds=(steps,), draft_seconds=draft)
    return Pipeline(ar.model, ar.codec, ar.name, ar.context, loaded.spec, costs, method)


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
    from specgen.drafting.stacked import StackedDrafter

    original = StackedDrafter.propose
    pipe = _stacked(tiny_qwen3_deep, tiny_dflash, dspark_other_taps, "full")
    drafts = {}
    for shadow in (False, True):
        log: list[tuple[int, list[int]]] = []

        def propose(self, anchor, max_tokens, params, generator, shadow=shadow, log=log):
            chosen = (self.step + 1) % 2
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


def test_stacked_needs_one_of_each(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    with pytest.raises(CheckpointError, match="two drafters of different kinds"):
        _stacked(tiny_qwen3_deep, tiny_dflash, tiny_dflash)
    with pytest.raises(SpecgenError, match="--method stacked takes 2 --drafter, got 1"):
        spec = SpecConfig(method="stacked", drafter=str(tiny_dspark))
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=spec)
    with pytest.raises(SpecgenError, match="no stacked drafter is known"):
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=SpecConfig(method="stacked"))


def test_a_drafter_for_another_target_is_refused(tiny_qwen3_deep, tiny_dflash, tmp_path):
    other = save_tiny_dspark(tmp_path / "other", hidden=32, head_dim=8)
    with pytest.raises(CheckpointError, match="does not fit target"):
        _stacked(tiny_qwen3_deep, tiny_dflash, other)


@pytest.mark.slow
def test_sampling_through_stacked_has_the_target_distribution(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark
):
    from test_dspark import _exact_token_distribution

    pipe = _stacked(tiny_qwen3_deep, tiny_dflash, tiny_dspark, "full")
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = _exact_token_distribution(pipe.model, prompt, params, 2).float()
    counts, session, n = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3
