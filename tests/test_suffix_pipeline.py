"""Suffix decoding in the pipeline: exact greedy and sampled output, the store of earlier
answers shared by a pipeline's sessions, and what the bench and the CLI do with it."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.api.spec import load_method
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import OptionError
from specgen.models.loading import load_target
from specgen.scheduling.cost import CostTable
from support.targets import TINY_VOCAB

TEXT = "one two three four, one two three four, one two"


@pytest.fixture(scope="module")
def base(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _suffix(base, policy="full", costs=None, **spec):
    spec = SpecConfig(method="suffix", verify_policy=policy, trace=True, **spec)
    method = load_method(base.model, spec, base.name)
    return Pipeline(base.model, base.codec, base.name, 256, spec, costs, method)


def test_the_store_carries_answers_to_later_requests(base):
    suffix = _suffix(base)
    want = base.generate(TEXT, raw=True, max_new_tokens=40, session=base.new_session())
    first = suffix.generate(TEXT, raw=True, max_new_tokens=40, session=suffix.new_session())
    again = suffix.generate(TEXT, raw=True, max_new_tokens=40, session=suffix.new_session())
    assert first.token_ids == again.token_ids == want.token_ids
    assert suffix.method.store.answers == 2
    # the second time the store holds the whole answer: far fewer steps
    assert again.stats.steps < first.stats.steps / 2, (first.stats.steps, again.stats.steps)


def test_an_answer_not_remembered_leaves_the_store_alone(base):
    suffix = _suffix(base)
    ids = suffix.encode(TEXT, raw=True)
    runs = []
    for _ in range(2):
        chunks = suffix.stream_ids(ids, max_new_tokens=40, session=suffix.new_session(),
                                   remember=False)  # fmt: skip
        runs.append([c.stats for c in chunks][-1])
    assert suffix.method.store.answers == 0
    assert runs[0].steps == runs[1].steps and runs[0].accepted == runs[1].accepted


def test_bench_repeats_of_a_prompt_draft_from_the_same_store(base):
    from specgen.bench.harness import run_bench
    from specgen.bench.suites import BenchPrompt

    suffix = _suffix(base)
    prompts = [BenchPrompt("qa", TEXT), BenchPrompt("qa", TEXT)]
    run = run_bench({"ar": base, "suffix": suffix}, prompts, max_new_tokens=30,
                    sampling=SamplingParams(), repeats=3)  # fmt: skip
    assert run.identical == {"suffix": 2}
    # the warm-up and each prompt once (its last repeat): not once per repeat
    assert suffix.method.store.answers == 3
    first, second = [r for r in run.runs if r.method == "suffix"]
    assert second.stats.steps < first.stats.steps  # the second prompt drew on the first


@pytest.mark.statistical
@pytest.mark.parametrize("policy", ["full", "cost"])
def test_sampling_through_suffix_has_the_target_distribution(
    base, tiny_qwen3_deep, policy, monkeypatch
):
    """The 5th answer token over 1500 samples, against the exact distribution (top-k 2
    makes 16 paths to it). The store fills with the earlier samples, so later drafts come
    from it as well as from the repetitive prompt; each is a point mass fixed before
    verifying. The answers are unseeded (a seeded one never reads the store), their
    generators seeded in turn so the test repeats."""
    from support.statistics import chi_square_pvalue, entropy_in_turn, exact_token_distribution

    entropy_in_turn(monkeypatch)

    costs = CostTable(contexts=(1,), seconds=(tuple(1.0 + 0.02 * n for n in range(33)),),
                      drafts={"suffix": (0.0,)})  # fmt: skip
    suffix = _suffix(base, policy, costs if policy == "cost" else None)
    store_hits = []
    rows = suffix.method.store.rows
    suffix.method.store.rows = lambda tail, length: _counted(rows(tail, length), store_hits)
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    prompt = suffix.encode(TEXT, raw=True)
    params = SamplingParams(temperature=1.0, top_k=2)
    exact = exact_token_distribution(target, prompt, params, 4).float()
    counts = torch.zeros(TINY_VOCAB)
    session, n, verified = suffix.new_session(), 1500, 0
    for _ in range(n):
        out = suffix.generate(TEXT, raw=True, sampling=params, max_new_tokens=6, session=session)
        counts[out.token_ids[4]] += 1
        verified += out.stats.verified
    assert verified > n // 2 and sum(store_hits) > n // 4  # drafts verified, many from the store
    assert chi_square_pvalue(counts, exact) > 1e-3
    shifted = exact.roll(1) * 0.1 + exact * 0.9  # the test can tell a slightly other one
    assert chi_square_pvalue(counts, shifted) < 1e-6


def _counted(rows, hits):
    hits.append(len(rows) > 0)
    return rows


def test_a_negative_store_is_refused():
    with pytest.raises(OptionError, match=r"--store-mib must be >= 0 \(got -1\)"):
        SpecConfig(method="suffix", store_mib=-1)
