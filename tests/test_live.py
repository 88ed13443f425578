"""The live view: pure rendering of hand-made stats, and the line-by-line live printer."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from specgen.api.pipeline import Chunk, Pipeline
from specgen.core.config import SpecConfig
from specgen.core.stats import GenStats
from specgen.scheduling.cost import CostTable
from specgen.scheduling.speedup import ModeledSpeedup, modeled_speedup
from specgen.terminal.live import (
    LiveAnswer,
    PlainAnswer,
    acceptance_bars,
    answer_view,
    status_panel,
)


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


# AR 10 ms a step at any context, verifying n drafts 10 + 2n ms, a DFlash draft 5 ms
PRICES = CostTable((1,), ((0.010, 0.012, 0.014, 0.016, 0.018),), {"dflash": (0.005,) * 4})


def _doubled(table: CostTable) -> CostTable:
    """The same machine measured while busy: every price twice as high."""
    seconds = tuple(tuple(2 * s for s in row) for row in table.seconds)
    drafts = {name: tuple(2 * s for s in times) for name, times in table.drafts.items()}
    return CostTable(table.contexts, seconds, drafts)


def _dflash_stats() -> GenStats:
    """An answer's steps: a prefill, then two drafted steps and a plain one."""
    stats = _stats()
    stats.shapes = [
        (11, "dflash", 4, 4, 4),  # 5 + 18 ms for 4 tokens
        (15, "dflash", 4, 2, 2),  # 5 + 14 ms for 2 tokens
        (17, None, 0, 0, 1),  # 10 ms for 1 token
    ]
    return stats


def test_the_modeled_speedup_prices_both_sides_from_the_table():
    # AR: 7 tokens at 10 ms; the steps: 23 + 19 + 10 ms
    assert modeled_speedup(_dflash_stats(), PRICES) == pytest.approx(0.070 / 0.052)


def test_the_modeled_speedup_prices_ar_at_each_tokens_own_context():
    table = CostTable((0, 100), ((0.010, 0.020), (0.020, 0.040)))  # both double by 100
    stats = GenStats()
    stats.shapes = [(50, None, 0, 1, 2)]  # verify 1 at context 50 (30 ms), 2 tokens
    ar = 0.015 + 0.0151  # contexts 50 and 51
    assert modeled_speedup(stats, table) == pytest.approx(ar / 0.030)


def test_a_uniformly_slow_table_does_not_change_the_modeled_speedup():
    stats = _dflash_stats()
    slow = _doubled(PRICES)
    assert modeled_speedup(stats, slow) == pytest.approx(modeled_speedup(stats, PRICES), 1e-12)
    # the old estimate, observed tokens/s over 1 / the table's AR step, doubled with it
    decoding = (stats.new_tokens - 1) / (stats.seconds - stats.ttft_seconds)
    old, old_slow = (decoding * t.step_seconds(0)[0] for t in (PRICES, slow))
    assert old_slow == pytest.approx(2 * old)


def test_plain_steps_model_as_ar_itself():
    stats = GenStats()
    stats.shapes = [(10 + i, None, 0, 0, 1) for i in range(5)]
    assert modeled_speedup(stats, PRICES) == pytest.approx(1.0)


def test_no_modeled_speedup_without_a_table_steps_or_prices():
    assert modeled_speedup(_dflash_stats(), None) is None  # AR, or full without costs
    assert modeled_speedup(GenStats(), PRICES) is None  # nothing decoded after the prefill
    unpriced = GenStats()
    unpriced.shapes = [(11, "ngram", 2, 2, 3)]  # a drafter the table has no time for
    assert modeled_speedup(unpriced, PRICES) is None


def test_the_running_speedup_prices_new_steps_only_and_matches_the_function():
    stats = _dflash_stats()
    shapes, stats.shapes = stats.shapes, []
    meter = ModeledSpeedup(PRICES)
    assert meter.update(stats.shapes) is None
    for shape in shapes:  # steps arriving while the view redraws
        stats.shapes.append(shape)
        running = meter.update(stats.shapes)
    assert meter.priced == 3
    assert running == pytest.approx(modeled_speedup(stats, PRICES))
    assert meter.update(stats.shapes) == running  # nothing new: the same figure
    other = _dflash_stats()  # another answer's list: priced afresh
    assert meter.update(other.shapes[:1]) == pytest.approx(0.040 / 0.023)


def test_status_panel_shows_rate_tau_acceptance_and_the_modeled_speedup():
    stats = _dflash_stats()
    text = _text(status_panel(stats, modeled_speedup(stats, PRICES)))
    assert "7 tokens" in text and "7.0 tok/s" in text  # observed, as before
    assert "τ 2.33 (incl. bonus)" in text and "verify 2.67/step" in text
    assert "confidence 0.55" in text
    assert "acceptance by position █▅▅▁" in text
    assert "speedup vs AR ≈ 1.35x (modeled from step costs)" in text
    assert "estimate" not in text and "ms" not in text


def test_status_panel_shows_no_speedup_without_a_table():
    stats = _dflash_stats()
    text = _text(status_panel(stats, modeled_speedup(stats, None)))
    assert "τ 2.33" in text and "speedup" not in text


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
    view = LiveAnswer(console, PRICES, show_drafts=show_drafts)
    stats = _dflash_stats()
    view.push(_chunk("Hello wor", 6, stats))
    view.push(_chunk("ld.\nSecond line", 3, stats))
    view.push(_chunk(" ends\n\nlast", 0, stats))
    view.close(stats)
    raw = out.getvalue()
    for piece in ("Hello ", "wor", "ld.", "Second line", " ends", "last"):
        assert piece in raw
    assert "speedup vs AR ≈ 1.35x (modeled from step costs)" in raw
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
        from support.scripted_drafters import OracleDrafter

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


def test_a_real_answer_is_priced_alike_from_a_table_and_from_it_doubled(
    tiny_qwen3_deep, tiny_dflash
):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    prices = CostTable((1,), ((0.010,) + (0.011,) * 7,), {"dflash": (0.002,)})
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
    pipe = ar.with_spec(spec, costs=prices)  # fixed prices: never re-measured
    stats = pipe.generate("The quick brown fox", raw=True, max_new_tokens=24).stats
    assert any(shape[1] == "dflash" for shape in stats.shapes)  # the table names its drafter
    speedup = modeled_speedup(stats, pipe.costs)
    assert speedup is not None
    assert modeled_speedup(stats, _doubled(pipe.costs)) == pytest.approx(speedup, 1e-12)


def test_finished_text_wraps_at_words_not_at_the_terminals_edge():
    """The answer the live view leaves behind is wrapped where the live region wrapped it,
    between words: one long line handed to the terminal would be cut mid-word at its edge."""
    printed = []  # what the view prints for good, rendered as a 24-column terminal shows it
    console = Console(file=io.StringIO(), force_terminal=True, width=24, color_system=None)
    real = console.print

    def keep(*objects, **kwargs):
        shown = Console(file=io.StringIO(), width=24, color_system=None)
        with shown.capture() as captured:
            shown.print(*objects, **kwargs)
        printed.append(captured.get())
        real(*objects, **kwargs)

    console.print = keep
    view = LiveAnswer(console, None)
    words = "the quick brown foxes jumped over the lazy sleeping dogs again and again"
    view.push(_chunk(words + "\nand a second paragraph of several words", 0, _dflash_stats()))
    view.close(None)
    lines = "".join(printed).splitlines()
    # a 24-column terminal cuts any longer line (mid-word): none is longer
    assert lines and all(len(line) <= 24 for line in lines), lines
    assert " ".join(" ".join(lines).split()) == f"{words} and a second paragraph of several words"
