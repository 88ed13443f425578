"""Stacked over copy drafters (ngram, suffix) beside learned ones: a copy drafter is looked
at before each step and offered only where it has a draft, as an option of the kind it
drafted; output stays AR's, and sampling the target's distribution."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.methods.stacked.drafter import FREE_BUCKETS
from specgen.scheduling.cost import CostTable
from support.cli import FAST, assert_one_line_error, run
from support.statistics import chi_square_pvalue, entropy_in_turn, exact_token_distribution
from support.targets import TINY_VOCAB

GREEDY = SamplingParams()
REPEATS = "one two three four five, one two three four five, one two three"


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _stacked(ar, sources, policy="full", costs=None, **kw):
    spec = SpecConfig(method="stacked", drafter=tuple(map(str, sources)), verify_policy=policy,
                      trace=True, **kw)  # fmt: skip
    return ar.with_spec(spec, costs=costs)


def _cheap(pipe):
    """Prices under which drafting pays (a GPU's shape): verifying is nearly free."""
    steps = tuple(1.0 + 0.01 * n for n in range(pipe.method.max_draft_tokens + 1))
    return CostTable((1,), (steps,), {n: (0.0 if n in ("suffix", "ngram") else 0.2,)
                                       for n in pipe.drafters})  # fmt: skip


@pytest.mark.parametrize("policy", ["cost", "full"])
def test_copy_drafters_beside_learned_ones_equal_ar(ar, tiny_dflash, tiny_dspark, policy):
    for sources in (("suffix", tiny_dflash), (tiny_dspark, "ngram", "suffix")):
        pipe = _stacked(ar, sources, policy)
        if policy == "cost":
            pipe = ar.with_spec(pipe.spec, costs=_cheap(pipe))
        for text in (REPEATS, "The quick brown fox"):
            want = ar.generate(text, raw=True, max_new_tokens=40).token_ids
            got = pipe.generate(text, raw=True, max_new_tokens=40, session=pipe.new_session())
            assert got.token_ids == want, (sources, text)
    # the order given is the order mounted, each named by its kind
    assert pipe.drafters == ("dspark", "ngram", "suffix")


def test_a_copy_drafter_is_offered_only_where_it_has_a_draft(ar, tiny_dflash):
    pipe = _stacked(ar, ("suffix", tiny_dflash))
    drafter = pipe.new_session().drafter
    hidden = pipe.model.args.hidden_size
    drafter.observe([5, 6, 7, 8, 9, 5, 6], {i: torch.zeros(1, 7, hidden) for i in drafter.taps})
    offered = drafter.options_at(7, GREEDY)  # "5 6 7" occurred: suffix drafts "8 9 5 6"
    assert [o.source for o in offered] == ["suffix", "dflash"]
    assert offered[0].bucket >= FREE_BUCKETS and offered[1].bucket == 1
    assert [o.source for o in drafter.options_at(42, GREEDY)] == ["dflash"]  # no match


def test_where_the_text_repeats_the_free_draft_wins(ar, tiny_dflash):
    """Under prices where drafting pays, on a prompt that repeats itself, suffix (free,
    long matches) drafts most steps and DFlash (an untrained drafter) the others."""
    pipe = _stacked(ar, ("suffix", tiny_dflash))
    pipe = ar.with_spec(pipe.spec, costs=_cheap(pipe))
    text = " ".join(["alpha beta gamma delta epsilon zeta eta theta"] * 6)
    out = pipe.generate(text, raw=True, max_new_tokens=60)
    assert out.token_ids == ar.generate(text, raw=True, max_new_tokens=60).token_ids
    by = {name: d["steps"] for name, d in out.stats.to_dict()["drafters"].items()}
    assert by.get("suffix", 0) > by.get("dflash", 0), by


def test_bad_copy_sets_are_refused(ar, tiny_dflash, tiny_qwen3_deep):
    with pytest.raises(CheckpointError, match="stacked got suffix twice"):
        _stacked(ar, ("suffix", tiny_dflash, "suffix"))
    with pytest.raises(SpecgenError, match="--method stacked takes 2 or more --drafter, got 1"):
        Pipeline.load(str(tiny_qwen3_deep), device="cpu",
                      spec=SpecConfig(method="stacked", drafter="suffix"))  # fmt: skip
    # one named method alone is that method
    alone = Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=SpecConfig(drafter="suffix"))
    assert alone.spec.method == "suffix"


def test_cli_mounts_a_copy_drafter_by_name(tiny_qwen3_deep, tiny_dflash):
    base = ("generate", REPEATS, "--model", str(tiny_qwen3_deep), *FAST, "-n", "12", "--json",
            "--raw", "--verify-policy", "full")  # fmt: skip
    result = run(*base, "--drafter", "suffix", "--drafter", str(tiny_dflash))
    assert result.exit_code == 0, result.stderr
    drafted = json.loads(result.stdout)["stats"]["drafters"]  # stacked's, by drafter
    assert set(drafted) == {"suffix", "dflash"} or set(drafted) == {"suffix"}, drafted
    twice = run(*base, "--drafter", "suffix", "--drafter", "suffix", "--drafter", str(tiny_dflash))
    assert_one_line_error(twice, 2, "stacked got suffix twice")


@pytest.mark.statistical
def test_sampling_through_stacked_with_suffix_has_the_target_distribution(
    ar, tiny_dflash, monkeypatch
):
    """The 5th token over 1500 samples (top-k 2: 16 paths to it), where each step chooses
    between suffix's draft, looked at first, and DFlash's: a point mass fixed by committed
    tokens, or DFlash's greedy one. Unseeded answers (a seeded one reads neither the store
    nor what the choice learnt before it), their generators seeded in turn."""
    entropy_in_turn(monkeypatch)
    pipe = _stacked(ar, ("suffix", tiny_dflash), "cost")
    pipe = ar.with_spec(pipe.spec, costs=_cheap(pipe))
    prompt = pipe.encode(REPEATS, raw=True)
    params = SamplingParams(temperature=1.0, top_k=2)
    exact = exact_token_distribution(pipe.model, prompt, params, 4).float()
    counts, session, n, steps = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500, {}
    for _ in range(n):
        out = pipe.generate(REPEATS, raw=True, sampling=params, max_new_tokens=6,
                            session=session)  # fmt: skip
        counts[out.token_ids[4]] += 1
        for name, d in out.stats.to_dict()["drafters"].items():
            steps[name] = steps.get(name, 0) + d["steps"]
    assert steps.get("suffix", 0) > n // 4 and steps.get("dflash", 0) > 0, steps
    assert chi_square_pvalue(counts, exact) > 1e-3
    assert chi_square_pvalue(counts, exact.roll(1) * 0.1 + exact * 0.9) < 1e-6
