"""Turn a `BenchRun` into numbers (a JSON-able dict), a Rich table and an optional plot.

Per method and category (and "all"): tokens/s = new tokens / seconds summed over prompts
(each prompt's median time, prefill included), speedup = that over AR's on the same
prompts, τ = (accepted drafts + steps) / steps (the bonus counts, so AR = 1.00),
acceptance per draft position, a histogram of tokens committed per step (accepted + 1),
mean verify length (drafts verified per target forward) and mean time to first token.
Where the bench could price every step from its cost table (bench/modeled.py), also the
modeled tokens/s after the prefill and its speedup over AR's: the same on every rerun, so
it separates two schedulers' decisions where the measured speedups are within the noise.
Decode tokens/s leaves the first token out: (tokens − 1) / (seconds − TTFT).

An endpoint's rows (bench/endpoint.py) hold what the client measured (tokens/s from the
server's completion tokens and the client's clock, TTFT to the first content chunk) and
what the server said: τ, steps, drafts and the histogram where it reports them (None
where it does not; `tau_source` says whether τ was reported or derived from its counts).
Its speedup is over the local AR's tokens/s when AR ran in the same bench, else over the
endpoint asked for specgen's `ar` method (`baseline`), else None.
"""

from __future__ import annotations

from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from specgen.bench.harness import BenchRun, PromptRun
from specgen.core.config import AR
from specgen.core.errors import SpecgenError

ALL = "all"


def _aggregate(runs: list[PromptRun]) -> dict[str, Any]:
    if runs and runs[0].remote:
        return _aggregate_remote(runs)
    tokens = sum(r.stats.new_tokens for r in runs)
    seconds = sum(r.seconds for r in runs)
    steps = sum(r.stats.steps for r in runs)
    accepted = sum(r.stats.accepted for r in runs)
    verified = sum(r.stats.verified for r in runs)
    width = max((len(r.stats.verified_per_position) for r in runs), default=0)
    tried = [sum(_at(r.stats.verified_per_position, k) for r in runs) for k in range(width)]
    won = [sum(_at(r.stats.accepted_per_position, k) for r in runs) for k in range(width)]
    # steps that accepted at least k drafts, k = 0..width; then exactly k -> k + 1 tokens
    at_least = [steps] + won
    histogram = {
        str(k + 1): at_least[k] - (at_least[k + 1] if k + 1 < len(at_least) else 0)
        for k in range(len(at_least))
    }
    modeled = [r.modeled for r in runs]
    modeled_rate = None
    if runs and all(m is not None and m[1] > 0 for m in modeled):
        modeled_rate = round(sum(m[0] for m in modeled) / sum(m[1] for m in modeled), 3)
    return {
        "prompts": len(runs),
        "new_tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_second": round(tokens / seconds, 3) if seconds else 0.0,
        "tau": round((accepted + steps) / steps, 3) if steps else 0.0,
        "steps": steps,
        "mean_verify_length": round(verified / steps, 3) if steps else 0.0,
        "acceptance_per_position": [
            round(w / t, 4) if t else 0.0 for w, t in zip(won, tried, strict=True)
        ],
        "acceptance_histogram": {k: v for k, v in histogram.items() if v},
        "ttft_seconds": round(sum(r.ttft_seconds for r in runs) / len(runs), 4) if runs else 0.0,
        "decode_tokens_per_second": _decode_rate(runs),
        "modeled_tokens_per_second": modeled_rate,
    }


def _decode_rate(runs: list[PromptRun]) -> float | None:
    """Tokens after the first over the time after it, summed over the prompts."""
    timed = [r for r in runs if r.stats.new_tokens > 1 and r.seconds > r.ttft_seconds > 0]
    seconds = sum(r.seconds - r.ttft_seconds for r in timed)
    if not seconds:
        return None
    return round(sum(r.stats.new_tokens - 1 for r in timed) / seconds, 3)


def _aggregate_remote(runs: list[PromptRun]) -> dict[str, Any]:
    """An endpoint's row: the client's timings, and the server's speculative statistics
    where every answer carried them (a number over some of them would mislead)."""
    tokens = sum(r.stats.new_tokens for r in runs)
    seconds = sum(r.seconds for r in runs)
    served = [r.served for r in runs if r.served is not None and r.served.tau is not None]
    known = len(served) == len(runs)
    counted = known and all(s.steps and s.accepted is not None for s in served)
    steps = sum(r.stats.steps for r in runs) if counted else None
    accepted = sum(r.stats.accepted for r in runs)
    tau = None
    if steps:
        tau = round((accepted + steps) / steps, 3)
    elif known:  # τ per answer only: each answer took its tokens / τ steps
        parts = sum(r.stats.new_tokens / s.tau for r, s in zip(runs, served, strict=True) if s.tau)
        tau = round(tokens / parts, 3) if parts else None
    verified = sum(r.stats.verified for r in runs)
    drafted = counted and all(s.drafted is not None for s in served)
    histogram: dict[str, int] = {}
    if known and all(s.histogram for s in served):
        for s in served:
            for j, n in enumerate(s.histogram or ()):
                histogram[str(j + 1)] = histogram.get(str(j + 1), 0) + n  # accepted + 1
    derived = any(s.source == "derived" for s in served)
    return {
        "prompts": len(runs),
        "new_tokens": tokens,
        "seconds": round(seconds, 4),
        "tokens_per_second": round(tokens / seconds, 3) if seconds else 0.0,
        "tau": tau,
        "tau_source": None if tau is None else ("derived" if derived else "reported"),
        "steps": steps,
        "mean_verify_length": round(verified / steps, 3) if drafted and steps else None,
        "draft_acceptance_rate": round(accepted / verified, 4) if drafted and verified else None,
        "acceptance_per_position": [],  # no server reports per-position counts
        "acceptance_histogram": {k: v for k, v in histogram.items() if v},
        "ttft_seconds": round(sum(r.ttft_seconds for r in runs) / len(runs), 4) if runs else 0.0,
        "decode_tokens_per_second": _decode_rate(runs),
        "modeled_tokens_per_second": None,
    }


def _at(values: list[int], k: int) -> int:
    return values[k] if k < len(values) else 0


def summarize(run: BenchRun, meta: dict[str, Any]) -> dict[str, Any]:
    """Everything the bench measured, as one JSON-able dict."""
    methods = list(dict.fromkeys(r.method for r in run.runs))
    baseline = run.baseline or AR
    categories = list(dict.fromkeys(r.category for r in run.runs))
    results: dict[str, dict[str, Any]] = {}
    for m in methods:
        results[m] = {}
        for c in [*categories, ALL]:
            picked = [r for r in run.runs if r.method == m and c in (ALL, r.category)]
            results[m][c] = _aggregate(picked)
    for m in methods:
        for c, row in results[m].items():
            ar = results.get(baseline, {}).get(c, {})  # none: no speedup
            base = ar.get("tokens_per_second")
            row["speedup"] = round(row["tokens_per_second"] / base, 3) if base else None
            rate, base = row["modeled_tokens_per_second"], ar.get("modeled_tokens_per_second")
            row["modeled_speedup"] = round(rate / base, 4) if rate and base else None
    lossless = None
    if run.compared:
        lossless = {
            m: {
                "compared": run.compared[m],
                "identical": run.identical.get(m, 0),
                "match_rate": round(run.identical.get(m, 0) / run.compared[m], 4),
                "divergences": [
                    {
                        "category": d.category,
                        "prompt": d.prompt,
                        "turn": d.turn,
                        "position": d.position,
                        "margin": None if d.margin is None else round(d.margin, 5),
                    }
                    for d in run.divergences
                    if d.method == m
                ],
            }
            for m in run.compared
        }
    return {
        **meta,
        "methods": methods,
        "baseline": baseline if baseline in methods else None,
        "categories": categories,
        "tau_includes_bonus": True,
        "results": results,
        "memory_bytes": run.memory_bytes,
        "lossless": lossless,
    }


# (header, justify): short headers so the table fits 80 columns (docs/cli.md explains them)
COLUMNS = (
    ("method", "left"), ("category", "left"), ("tok/s", "right"), ("speedup", "right"),
    ("modeled", "right"), ("τ", "right"), ("verify", "right"), ("TTFT s", "right"),
    ("=AR", "right"),
)  # fmt: skip


def results_table(summary: dict[str, Any]) -> Table:
    """One row per method and category: speed, speedup, τ, verify length, TTFT, identity.
    No side borders and single spaces between columns, so it fits 80 columns; a long
    category name folds onto a second line instead of squeezing the numbers to `1.00…`."""
    title = (
        f"specgen bench · {summary.get('model')} · {summary.get('suite')} · "
        f"T={summary.get('temperature')} · τ includes the bonus token"
    )
    table = Table(
        title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
        pad_edge=False, collapse_padding=True,
    )  # fmt: skip
    for header, justify in COLUMNS:
        wraps = header == "category"  # the only free text: it folds, numbers never do
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold")
    # an endpoint's name (endpoint:host:port) is long: it folds rather than widen the table
    table.columns[0].no_wrap = False
    lossless = summary.get("lossless") or {}
    for m in summary["methods"]:
        for c in [*summary["categories"], ALL]:
            row = summary["results"][m][c]
            same = "-"
            if m != summary.get("baseline", AR) and m in lossless:
                bad = [d for d in lossless[m]["divergences"] if c in (ALL, d["category"])]
                same = f"{row['prompts'] - len(bad)}/{row['prompts']}"
            table.add_row(
                # Text: an endpoint's name is no markup ("endpoint:x:8000" is not an emoji)
                Text(m) if c == summary["categories"][0] or len(summary["categories"]) == 1 else "",
                c,
                f"{row['tokens_per_second']:.1f}",
                f"{row['speedup']:.2f}x" if row["speedup"] is not None else "-",
                f"{row['modeled_speedup']:.3f}x" if row.get("modeled_speedup") else "-",
                _fixed(row["tau"]),
                _fixed(row["mean_verify_length"]),
                f"{row['ttft_seconds']:.2f}",
                same,
                end_section=c == ALL,
            )
    return table


def _fixed(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def acceptance_lines(summary: dict[str, Any]) -> list[str]:
    """Per method (all categories): acceptance per position and the tokens-per-step
    histogram, one line each."""
    lines = []
    for m in summary["methods"]:
        if m == summary.get("baseline", AR):
            continue
        row = summary["results"][m][ALL]
        if "tau_source" in row:  # an endpoint: what its server said
            hist = " ".join(f"{k}:{v}" for k, v in row["acceptance_histogram"].items())
            if row["tau"] is None:
                lines.append(f"{m}: the server reports no speculative statistics (τ unknown)")
            else:
                lines.append(
                    f"{m}: τ {row['tau_source']} by the server"
                    + (f" · tokens per step {hist}" if hist else "")
                )
            continue
        per_pos = " ".join(f"{a:.2f}" for a in row["acceptance_per_position"]) or "-"
        hist = " ".join(f"{k}:{v}" for k, v in row["acceptance_histogram"].items())
        lines.append(f"{m}: acceptance by position {per_pos} · tokens per step {hist}")
    return lines


def plot(summary: dict[str, Any], path: str) -> None:
    """Speedup and τ per category, and the tokens-per-step histogram, as a PNG."""
    plt = pyplot()
    baseline = summary.get("baseline", AR if AR in summary["methods"] else None)
    methods = [m for m in summary["methods"] if m != baseline] or summary["methods"][:1]
    cats = [*summary["categories"], ALL]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    width = 0.8 / len(methods)
    # endpoints alone, none of them AR, have nothing to divide by: their tokens/s instead
    key, first = ("speedup", f"speedup vs {baseline}") if baseline else (
        "tokens_per_second", "tokens/s")  # fmt: skip
    for i, m in enumerate(methods):
        xs = [j + i * width for j in range(len(cats))]
        axes[0].bar(xs, [summary["results"][m][c][key] or 0 for c in cats], width, label=m)
        axes[1].bar(xs, [summary["results"][m][c]["tau"] or 0 for c in cats], width, label=m)
        hist = summary["results"][m][ALL]["acceptance_histogram"]
        total = sum(hist.values()) or 1
        if hist:  # an endpoint whose server reports none has no curve
            axes[2].plot([int(k) for k in hist], [v / total for v in hist.values()], "o-", label=m)
    for ax, title in zip(axes[:2], (first, "τ (incl. bonus)"), strict=True):
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(cats))], cats, rotation=30)
        ax.set_title(title)
        ax.legend()
    if key == "speedup":
        axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[2].set_title("tokens committed per step")
    axes[2].set_xlabel("accepted + 1")
    if axes[2].get_legend_handles_labels()[0]:
        axes[2].legend()
    fig.suptitle(f"specgen bench · {summary.get('model')} · {summary.get('suite')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def pyplot() -> Any:
    """matplotlib's pyplot on a file-only backend; without matplotlib a one-line error (the
    bench calls this before it runs, so a missing plotter does not cost a whole run)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SpecgenError("--plot needs matplotlib: pip install 'specgen[plot]'") from None
    return plt
