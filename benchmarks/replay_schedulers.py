"""The real verify schedulers replayed over recorded drafts (benchmarks/replay.py),
priced as a what-if bench run prices them (benchmarks/what_if_prices.py): modeled speedup
over AR and τ per category for dflash, dspark and stacked, and stacked over the better of
the two (issue 8's goal: at least 0.97 in every category, above 1 on the mixed suite).
Seconds for hundreds of answers where a what-if bench run takes half an hour.

`--check RAW` compares with a what-if bench run's output over the same prompts: the last
columns are the largest differences in τ and modeled speedup between the two (0 when the
replay decided every step as the bench did).

    python benchmarks/record_drafts.py --suite benchmarks/prompts/spec_bench.jsonl \\
        --num-prompts 52 --out drafts.jsonl
    python benchmarks/replay_schedulers.py drafts.jsonl \\
        --check benchmarks/results/cpu-what-if-h200-prices.raw.txt

The drafts recorded for the what-if bench's 52 Spec-Bench prompts and for 156 more (the
next 12 per category) are in benchmarks/results/cpu-drafts-spec-bench-{52,156}.jsonl.gz.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections.abc import Mapping, Sequence
from typing import Any

from what_if_prices import PRESETS, priced_pipelines

# EAGLE-3's chain on the H200 at Qwen3-8B shapes, per drafted token (ratio to an AR step):
# an assumption, never measured (one eager layer and the draft-vocabulary head per token,
# against DFlash's 0.25 for its whole block)
EAGLE3_H200_PER_TOKEN = 0.07


def summary(traces: Sequence[Mapping[str, Any]], results: Mapping, prices) -> dict:
    """Per method and category (and "all"): τ and modeled speedup over AR."""
    from specgen.scheduling.cost import modeled

    step = prices.seconds[0][0]  # AR: one token per plain step
    cats = list(dict.fromkeys(t["category"] for t in traces if t["index"] >= 0))
    table: dict[str, dict[str, dict[str, float]]] = {}
    for method, answers in results.items():
        table[method] = {}
        for cat in [*cats, "all"]:
            picked = [a for t, a in zip(traces, answers, strict=True)
                      if t["index"] >= 0 and cat in ("all", t["category"])]  # fmt: skip
            priced = [modeled(a.shapes, prices) for a in picked]
            steps = sum(a.steps for a in picked)
            table[method][cat] = {
                "tau": (sum(a.accepted for a in picked) + steps) / steps,
                "modeled_speedup": sum(p[0] for p in priced) / sum(p[1] for p in priced) * step,
            }
    return table


def print_table(table: Mapping, check: Mapping | None) -> None:
    methods = list(table)
    singles = [m for m in methods if m != "stacked"]
    print("category".ljust(15) + "".join(f"{m:>20}" for m in methods) + "   stacked/best"
          + ("   check: Δτ Δmodeled" if check else ""))  # fmt: skip
    for cat in table["stacked"]:
        row = cat.ljust(15)
        for m in methods:
            r = table[m][cat]
            row += f"    {r['modeled_speedup']:6.4f} τ {r['tau']:5.3f}"
        best = max(table[m][cat]["modeled_speedup"] for m in singles)
        row += f"   {table['stacked'][cat]['modeled_speedup'] / best:12.4f}"
        if check:
            dtau = max(abs(table[m][cat]["tau"] - check[m][cat]["tau"]) for m in methods)
            dmod = max(abs(table[m][cat]["modeled_speedup"] - check[m][cat]["modeled_speedup"])
                       for m in methods)  # fmt: skip
            row += f"   {dtau:8.3f} {dmod:8.4f}"
        print(row)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+", help="record_drafts.py's JSON lines (.gz too), "
                        "replayed one after another")  # fmt: skip
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200-qwen3-8b")
    parser.add_argument("--measured", action="store_true",
                        help="this machine's measured prices instead of a preset's")  # fmt: skip
    parser.add_argument("--drafter", action="append", default=[],
                        help="the drafters the traces were recorded with (default: the "
                        "registry's); every one is replayed alone and stacked")  # fmt: skip
    parser.add_argument("--slope", type=float, help="verify cost per draft (override)")
    parser.add_argument("--dflash", type=float, help="DFlash draft / AR step (override)")
    parser.add_argument("--dspark", type=float, help="DSpark draft / AR step (override)")
    parser.add_argument("--eagle3", type=float, default=EAGLE3_H200_PER_TOKEN,
                        help="EAGLE-3 draft / AR step per chain token")  # fmt: skip
    parser.add_argument("--check", help="a what-if bench run's output over the same prompts")
    parser.add_argument("--json", action="store_true", help="the table as JSON")
    args = parser.parse_args()

    from replay import replay

    from specgen.bench.modeled import prices_of
    from specgen.cli.bench import _pipelines
    from specgen.cli.common import quiet_libraries
    from specgen.cli.options import Run

    quiet_libraries()
    traces = []
    for path in args.traces:
        opened = gzip.open(path, "rt") if path.endswith(".gz") else open(path)  # noqa: SIM115
        with opened as lines:
            rows = [json.loads(line) for line in lines]
        traces += [r for r in rows if r["index"] >= 0 or not traces]  # one warm-up, first
    singles = list(traces[0]["drafts"])  # the recorded drafters, by name
    methods = (*singles, "stacked")
    slope, dflash, dspark = PRESETS[args.preset]
    slope = slope if args.slope is None else args.slope
    prices = {
        "dflash": dflash if args.dflash is None else args.dflash,
        "dspark": dspark if args.dspark is None else args.dspark,
        "eagle3": tuple(args.eagle3 * k for k in range(1, 17)),
    }
    run = Run(device="cpu", dtype="float32", quiet=True)
    pipes = _pipelines(run, ",".join(methods), args.drafter)
    if not args.measured:
        pipes = priced_pipelines(pipes, slope, {n: prices[n] for n in singles})
    results = replay(traces, {m: pipes[m] for m in methods})
    table = summary(traces, results, prices_of(pipes[m].costs for m in methods))
    check = None
    if args.check:
        lines = open(args.check, encoding="utf-8").read().splitlines()
        check = json.loads([line for line in lines if line.startswith("{")][-1])["results"]
    if args.json:
        print(json.dumps(table))
    else:
        print_table(table, check)


if __name__ == "__main__":
    main()
