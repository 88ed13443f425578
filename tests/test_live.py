"""The live view: pure rendering of hand-made stats, and the line-by-line live printer."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from specgen.config import SpecConfig
from specgen.live import (
    LiveAnswer,
    PlainAnswer,
    acceptance_bars,
    answer_view,
    speedup_estimate,
    status_panel,
)
from specgen.pipeline import Chunk, Pipeline
from specgen.scheduling.cost import CostTable
from specgen.stats import GenStats


def _stats(verify_policy="cost") -> GenStats:
    stats = GenStats(prompt_tokens=10, verify_policy=verify_policy)
    stats.record_step(1, 0, 0, None)  # the prefill's token
    stats.record_step(4, 4, 3, None, confidence=(0.9, 0.8, 0.7, 0.2))
    stats.record_step(2, 4, 1, None, confidence=(0.9, 0.5, 0.3, 0.1))
    stats.seconds, stats.ttft_seconds = 1.0, 0.2
    return stats


def _text(renderable, width=100) -> str:
    console = Console(file=io.StringIO(), width=width, record=True)
    console.print(renderable)
    return console.export_text()


def test_acceptance_bars():
    assert acceptance_bars([1.0, 0.5, 0.0]) == "█▅▁"
    assert acceptance_bars([]) == ""


def test_speedup_estimate_uses_decoding_time_only():
    stats = _stats()  # 7 tokens; 6 after the first in 0.8 s
    assert speedup_estimate(stats, 0.2) == pytest.approx(6 / 0.8 * 0.2)
    assert speedup_estimate(stats, None) is None
    assert speedup_estimate(GenStats(), 0.2) is None


def test_status_panel_shows_rate_tau_acceptance_and_the_estimate():
    text = _text(status_panel(_stats(), ar_step_seconds=0.2))
    assert "7 tokens" in text and "7.0 tok/s" in text
    assert "τ 2.33 (incl. bonus)" in text and "verify 2.67/step" in text
    assert "confidence 0.55" in text
    assert "acceptance by position █▅▅▁" in text
    assert "speedup vs AR ≈ 1.50x (estimate: AR step 200.0 ms" in text


def test_status_panel_for_plain_decoding_is_short():
    stats = GenStats(new_tokens=5, seconds=1.0)
    text = _text(status_panel(stats))
    assert "5 tokens" in text and "τ" not in text and "speedup" not in text


def _chunk(text, draft_chars, stats):
    return Chunk(text=text, token_ids=(1,), stats=stats, draft_chars=draft_chars)


@pytest.mark.parametrize("show_drafts", [False, True])
def test_live_answer_prints_finished_lines_and_the_final_panel(show_drafts):
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system="standard")
    costs = CostTable(contexts=(1,), seconds=((0.2, 0.3),))
    view = LiveAnswer(console, costs, show_drafts=show_drafts)
    stats = _stats()
    view.push(_chunk("Hello wor", 6, stats))
    view.push(_chunk("ld.\nSecond line", 3, stats))
    view.push(_chunk(" ends\n\nlast", 0, stats))
    view.close(stats)
    raw = out.getvalue()
    for piece in ("Hello ", "wor", "ld.", "Second line", " ends", "last", "speedup vs AR"):
        assert piece in raw
    assert raw.index("Hello") < raw.index("Second line") < raw.index("last")
    assert ("\x1b[36m" in raw) == show_drafts  # cyan only when asked


def test_answer_view_is_plain_when_stdout_is_not_a_terminal(tiny_llama, capsys):
    pipe = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    view = answer_view(pipe, quiet=False, show_drafts=False)
    assert isinstance(view, PlainAnswer)


class _OracleMethod:
    """A draft method whose drafter is the target itself: every draft is accepted."""

    max_draft_tokens = 4

    def __init__(self, model):
        self.model = model
        self.mounted = {"oracle": self}

    def new_drafter(self, capacity):
        from test_loop import OracleDrafter

        return OracleDrafter(self.model)


def test_chunks_say_which_text_came_from_drafts(tiny_llama):
    base = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    spec = SpecConfig(method="ngram", verify_policy="full")  # the name only labels stats
    pipe = Pipeline(base.model, base.codec, base.name, 128, spec, None, _OracleMethod(base.model))
    chunks = list(pipe.stream("The quick brown fox", raw=True, max_new_tokens=30))
    text = "".join(c.text for c in chunks)
    assert text == pipe.codec.decode([t for c in chunks for t in c.token_ids])
    assert all(0 <= c.draft_chars <= len(c.text) for c in chunks)
    assert sum(c.draft_chars for c in chunks) > len(text) / 2  # most text came from drafts
