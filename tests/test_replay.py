"""Scheduler replay (benchmarks/replay.py): over recorded drafts it takes the real loop's steps."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the replay is research code beside the benchmarks
from replay import record, replay  # noqa: E402

STEPS = tuple(1.0 + 0.01 * n for n in range(8))  # a GPU's prices: verifying is nearly free
DRAFT = 0.1
SAMPLE = BENCHMARKS / "prompts" / "spec_bench_sample.jsonl"


def _priced(ar: Pipeline, drafters: dict[str, str | None]) -> dict[str, Pipeline]:
    """dflash, dspark and stacked on `ar`'s target under the cost policy, deciding from fixed
    prices (not this machine's noisy measurement, so that every drafter gets to draft).
    `drafters`: each method's checkpoint (None: the registry's)."""
    from specgen.scheduling.cost import CostTable

    costs = CostTable(
        contexts=(1,), seconds=(STEPS,),
        # stacked also mounts the copy drafter suffix, whose drafts are lookups: nearly free
        drafts={"dflash": (DRAFT,), "dspark": (DRAFT,), "suffix": (DRAFT / 100,)},
    )  # fmt: skip
    both = None if None in drafters.values() else tuple(drafters.values())
    pipes = {}
    for method, drafter in (*drafters.items(), ("stacked", both)):
        spec = SpecConfig(method=method, drafter=drafter, verify_policy="cost")
        pipes[method] = ar.with_spec(spec, costs=costs)
    return pipes


def _check_replay(ar: Pipeline, pipes: dict[str, Pipeline], prompts: list[str], n: int) -> list:
    """Record the prompts' drafts, run each pipeline on them in order (each answer's
    scheduler learning from the last's) and replay the same; returns the real stats."""
    stacked = pipes["stacked"]
    traces = [record(stacked, stacked.encode(p), n) for p in prompts]
    for prompt, trace in zip(prompts, traces, strict=True):  # the recording pass is plain AR
        want = ar.generate(prompt, max_new_tokens=n, session=ar.new_session())
        assert trace["tokens"][: len(want.token_ids)] == want.token_ids
    real = {}
    for method, pipe in pipes.items():
        pipe.schedulers.learnt = None
        real[method] = [
            pipe.generate(p, max_new_tokens=n, session=pipe.new_session()).stats for p in prompts
        ]
    replayed = replay(traces, pipes)
    for method in pipes:
        assert [r.shapes for r in replayed[method]] == [s.shapes for s in real[method]]
        assert [r.accepted for r in replayed[method]] == [s.accepted for s in real[method]]
    shapes = [s for stats in real["stacked"] for s in stats.shapes]
    assert {s[1] for s in shapes} == {"dflash", "dspark", None}  # both drafted, and skipped
    assert any(s[3] < s[2] for s in shapes)  # confidences trimmed a DSpark draft
    return [stats for m in real for stats in real[m]]


@pytest.mark.integration  # the replay tool against the loops
def test_replay_takes_the_loops_steps(tiny_qwen3_deep, tiny_dflash, tiny_dspark):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    pipes = _priced(ar, {"dflash": str(tiny_dflash), "dspark": str(tiny_dspark)})
    prompts = ["The quick brown fox", "one two one two one two", "def add(a, b):"]
    _check_replay(ar, pipes, prompts, 40)


@pytest.mark.slow
def test_replay_takes_the_loops_steps_on_the_default_model(embedded_dir):
    """With the shipped drafters, whose drafts are accepted, so that a replay that got
    acceptance wrong would decide differently."""
    os.environ.setdefault("SPECGEN_HOME", str(embedded_dir.parents[1]))
    ar = Pipeline.load("smollm2-135m", device="cpu", dtype="float32")
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines()]
    prompts = [r["turns"][0] for r in rows if r["question_id"] in {81, 111, 121}]
    # the shipped drafters named, not the alias's stack: that mounts the copy drafter suffix
    # too, whose drafts a replay of recorded drafts does not model
    shipped = {m: f"specgen:smollm2-135m-{m}" for m in ("dflash", "dspark")}
    stats = _check_replay(ar, _priced(ar, shipped), prompts, 40)
    assert sum(s.accepted for s in stats) > 20


@pytest.mark.integration  # the replay tool against the loops
def test_replay_takes_the_loops_steps_with_three_drafters(tiny_qwen3_deep, tiny_dflash, tmp_path):
    """Stacked over DFlash, DSpark and EAGLE-3 (a chain drafter, priced per token): the
    replay still takes each method's real steps."""
    from specgen.scheduling.cost import CostTable
    from support.drafters import save_tiny_dspark
    from support.eagle3 import save_eagle3

    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    paths = {
        "dflash": str(tiny_dflash),
        "dspark": str(save_tiny_dspark(tmp_path / "dspark", target_layer_ids=[0, 2, 4])),
        "eagle3": str(save_eagle3(tmp_path / "eagle3", "specforge", taps=[1, 3, 5])),
    }
    drafts = {
        "dflash": (DRAFT,),
        "dspark": (DRAFT,),
        "eagle3": tuple(0.03 * k for k in range(1, 8)),
    }
    costs = CostTable(contexts=(1,), seconds=(STEPS,), drafts=drafts)
    pipes = {}
    for method, drafter in (*paths.items(), ("stacked", tuple(paths.values()))):
        spec = SpecConfig(method=method, drafter=drafter, verify_policy="cost")
        pipes[method] = ar.with_spec(spec, costs=costs)
    prompts = ["The quick brown fox", "one two one two one two", "def add(a, b):"]
    stacked = pipes["stacked"]
    traces = [record(stacked, stacked.encode(p), 40) for p in prompts]
    assert set(traces[0]["drafts"]) == set(paths)
    real = {}
    for method, pipe in pipes.items():
        real[method] = [
            pipe.generate(p, max_new_tokens=40, session=pipe.new_session()).stats for p in prompts
        ]
    replayed = replay(traces, pipes)
    for method in pipes:
        assert [r.shapes for r in replayed[method]] == [s.shapes for s in real[method]]
    used = {s[1] for stats in real["stacked"] for s in stats.shapes}
    assert "eagle3" in used
