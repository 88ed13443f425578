"""Per-answer statistics from hand-made steps: one definition of acceptance per position
for the JSON stats, the live view and the bench; counts in words ("1 step")."""

from __future__ import annotations

import io

from rich.console import Console

from specgen.bench.harness import BenchRun, PromptRun
from specgen.bench.report import summarize
from specgen.core.stats import GenStats
from specgen.terminal.display import drafter_shares, plural, stats_line
from specgen.terminal.live import status_panel


def _steps() -> GenStats:
    stats = GenStats(prompt_tokens=4, verify_policy="cost")
    stats.record_step(1, 0, 0, None)  # the prefill's token: verifies nothing
    stats.record_step(4, 3, 3, None)  # drafts at positions 1-3 verified, all accepted
    stats.record_step(2, 4, 1, None)  # 4 verified, the first accepted
    stats.record_step(1, 0, 0, None)  # a plain decoding step (the scheduler drafted nothing)
    stats.record_step(1, 2, 0, "stop")  # 2 verified, none accepted
    return stats


def test_accepted_per_position_is_per_verified_position_with_zeros_kept():
    stats = _steps()
    # position 1: verified by 3 steps, accepted by 2; 2: 3 and 1; 3: 2 and 1; 4: 1 and 0
    want = [round(2 / 3, 4), round(1 / 3, 4), 0.5, 0.0]
    assert stats.to_dict()["accepted_per_position"] == want
    assert stats.acceptance_per_position() == want  # what the live view draws
    run = PromptRun("ar", "qa", 0, list(range(stats.new_tokens)), 1.0, 0.1, stats)
    bench = summarize(BenchRun(runs=[run]), {})["results"]["ar"]["all"]  # any method's row
    assert bench["acceptance_per_position"] == want


def test_plain_decoding_has_no_positions():
    stats = GenStats()
    stats.record_step(1, 0, 0, None)
    stats.record_step(1, 0, 0, "stop")
    assert stats.to_dict()["accepted_per_position"] == []


def test_counts_are_pluralised():
    assert plural(1, "step") == "1 step" and plural(0, "step") == "0 steps"
    stats = GenStats(verify_policy="cost")
    stats.record_step(1, 0, 0, None)
    stats.record_step(2, 2, 1, "stop", drafter="dflash")
    assert drafter_shares(stats) == ["dflash 1 step τ 2.00"]
    one = GenStats()
    one.record_step(1, 0, 0, "stop")
    assert stats_line(one).startswith("1 token ·")
    console = Console(file=io.StringIO(), width=100, record=True)
    console.print(status_panel(stats))
    text = console.export_text()
    assert "dflash 1 step τ" in text and "1 steps" not in text
