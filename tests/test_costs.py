"""Measured step costs that go stale (measured while the machine was busy, say) are found
by the steps themselves and measured again; `--measure-costs` measures them up front."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import SpecConfig
from specgen.core.stats import GenStats
from specgen.engine.costs import CHECK_STEPS, DRIFT, CostCheck
from specgen.scheduling.cost import CostTable

runner = CliRunner()


def _stats(steps: int, seconds: float) -> GenStats:
    """An answer of `steps` plain decoding steps, each taking `seconds`."""
    stats = GenStats()
    stats.shapes = [(10 + i, None, 0, 0, 1) for i in range(steps)]
    stats.step_seconds = [seconds] * steps
    return stats


def test_a_table_is_judged_after_enough_steps_and_only_when_far_off():
    table = CostTable(contexts=(1,), seconds=((0.02, 0.03),))
    check = CostCheck()
    assert check.stale(_stats(CHECK_STEPS - 1, 0.2), table) is None  # too few steps yet
    assert check.stale(_stats(1, 0.2), table) == pytest.approx(10.0)  # 10x slower: stale
    for seconds in (0.02 * DRIFT * 0.9, 0.02 / DRIFT * 1.1):  # within the noise allowed
        assert CostCheck().stale(_stats(CHECK_STEPS, seconds), table) is None
    assert CostCheck().stale(_stats(CHECK_STEPS, 0.002), table) == pytest.approx(0.1)


class FakeClock:
    """A clock that moves 1 ms each time it is read: every step and every measured block
    then takes the same time whatever else the machine is doing."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1e-3
        return self.t


def test_a_stale_table_is_measured_again_and_decides_from_then_on(
    tiny_qwen3_deep, tiny_dflash, monkeypatch, tmp_path
):
    from specgen.core import clock

    monkeypatch.setattr(clock, "now", FakeClock())
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))  # measured here, on the fake clock
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    notes: list[str] = []
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
    pipe = ar.with_spec(spec, notify=notes.append)
    measured = pipe.costs
    # as if measured while another process had the CPU: every step priced 50x too dear
    slow = tuple(tuple(50 * s for s in row) for row in measured.seconds)
    pipe.costs = replace(measured, seconds=slow)
    session = pipe.new_session()
    text = "The quick brown fox"
    want = ar.generate(text, raw=True, max_new_tokens=CHECK_STEPS + 8).token_ids
    got = pipe.generate(text, raw=True, max_new_tokens=CHECK_STEPS + 8, session=session)
    assert got.token_ids == want  # exact whatever the prices
    assert any("measuring them again" in n for n in notes)
    assert pipe.costs.seconds[0][0] < slow[0][0] / 5  # measured afresh, not the stale one
    assert session.scheduler.costs is pipe.costs and pipe.schedulers.learnt.costs is pipe.costs
    notes.clear()
    pipe.costs = replace(pipe.costs, seconds=slow)
    pipe.generate(text, raw=True, max_new_tokens=CHECK_STEPS + 8)
    assert not any("again" in n for n in notes)  # once per pipeline, not on every answer


def test_fixed_prices_are_not_second_guessed(tiny_qwen3_deep, tiny_dflash):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    prices = CostTable(contexts=(1,), seconds=((1.0,) * 8,), drafts={"dflash": (0.1,)})
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
    pipe = ar.with_spec(spec, costs=prices)  # seconds per step: nothing like this machine
    pipe.generate("The quick brown fox", raw=True, max_new_tokens=CHECK_STEPS + 8)
    assert pipe.costs.seconds == prices.seconds


def test_measure_costs_measures_again_up_front(tiny_qwen3_deep, tiny_dflash):
    args = ["generate", "The quick brown fox", "--model", str(tiny_qwen3_deep), "--json",
            "--device", "cpu", "--dtype", "float32", "-n", "4",
            "--drafter", str(tiny_dflash)]  # fmt: skip
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.stderr
    again = runner.invoke(app, args)  # cached: nothing measured
    assert again.exit_code == 0 and "measur" not in again.stderr
    forced = runner.invoke(app, [*args, "--measure-costs"])
    assert forced.exit_code == 0, forced.stderr
    assert "measured verify costs" in forced.stderr and "drafter's cost" in forced.stderr
    assert json.loads(forced.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]


def test_what_is_measured_is_said_once_with_short_names(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, monkeypatch, tmp_path
):
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))  # nothing cached yet
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    notes: list[str] = []
    spec = SpecConfig(method="stacked", drafter=(str(tiny_dflash), str(tiny_dspark)))
    ar.with_spec(spec, notify=notes.append)
    (said,) = [n for n in notes if n.startswith("measured")]  # one line, after, with its time
    (before,) = [n for n in notes if n.startswith("measuring")]  # and one before, an estimate
    assert notes.index(before) < notes.index(said)
    assert re.fullmatch(
        r"measuring verify costs and the dflash and dspark drafters' costs once for this "
        r"model and device, (about \d+ s|under a second)",
        before,
    ), before
    assert re.fullmatch(
        r"measured verify costs and the dflash and dspark drafters' costs once for this "
        r"model and device in \d+\.\d s \(cached\)",
        said,
    ), said
    assert f"loading DFlash drafter {tiny_dflash.name}" in notes  # its directory, not its path
    assert not any(str(tiny_dflash.parent) in n for n in notes)
    notes.clear()
    ar.with_spec(spec, notify=notes.append)
    assert not any(n.startswith("measur") for n in notes)  # cached: nothing said


def test_threads_option(tiny_llama):
    import torch

    base = ["generate", "hi", "--model", str(tiny_llama), "--device", "cpu", "-n", "2", "--json"]
    before = torch.get_num_threads()
    try:
        result = runner.invoke(app, [*base, "--threads", "1"])
        assert result.exit_code == 0, result.stderr
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    bad = runner.invoke(app, [*base, "--threads", "0"])
    assert bad.exit_code == 2 and "--threads must be at least 1" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def _stale_pipe(tiny_qwen3_deep, tiny_dflash, monkeypatch, tmp_path, notes):
    """A dflash pipeline whose measured table prices every step 50x too dear (as if
    measured while another process had the CPU), on the fake clock; and its AR."""
    from specgen.core import clock

    monkeypatch.setattr(clock, "now", FakeClock())
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
    pipe = ar.with_spec(spec, notify=notes.append)
    slow = tuple(tuple(50 * s for s in row) for row in pipe.costs.seconds)
    pipe.costs = replace(pipe.costs, seconds=slow)
    return ar, pipe


def test_measuring_again_gives_way_to_waiting_requests(
    tiny_qwen3_deep, tiny_dflash, monkeypatch, tmp_path
):
    notes: list[str] = []
    ar, pipe = _stale_pipe(tiny_qwen3_deep, tiny_dflash, monkeypatch, tmp_path, notes)
    stale = pipe.costs
    text, n = "The quick brown fox", CHECK_STEPS + 8
    want = ar.generate(text, raw=True, max_new_tokens=n).token_ids
    asked = []
    pipe.busy = lambda: asked.append(1) or len(asked) > 3  # a request comes mid-measurement
    assert pipe.generate(text, raw=True, max_new_tokens=n).token_ids == want
    assert 3 < len(asked) < 8  # stopped at the forward after the request came
    assert any("stopped measuring" in note for note in notes)
    assert pipe.costs is stale  # kept as they were
    pipe.busy = lambda: True  # a request waits when the next answer ends: nothing begins
    notes.clear()
    assert pipe.generate(text, raw=True, max_new_tokens=n).token_ids == want
    assert not any("measur" in note for note in notes) and pipe.costs is stale
    pipe.busy = lambda: False  # idle again: the steps judge the table anew, and it is measured
    assert pipe.generate(text, raw=True, max_new_tokens=n).token_ids == want
    assert any("measuring them again" in note for note in notes)
    assert pipe.costs.seconds[0][0] < stale.seconds[0][0] / 5
