"""Print a `specgen bench --json` run as one row per category: tok/s, speedup and τ of
every method side by side (the JSON is the bench output's last line). With stacked, dflash
and dspark in the run, a last column holds stacked's speed over the better of the two
(issue 8's goal: at least 0.97 in every category, above 1 on the mixed suite), marked "="
where stacked verified exactly what one of them verified (the same acceptance histogram
and step count: there the ratio is the machine's noise, not the selector's doing), and
the same ratio of modeled speeds (bench/modeled.py: every step priced from the cost
table, so reruns agree and a 1% difference between schedulers is real).

    python benchmarks/summarize_bench.py bench-output.txt
"""

from __future__ import annotations

import json
import sys

MODELED = ("stacked", "dflash", "dspark")


def main() -> None:
    lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
    summary = json.loads([line for line in lines if line.startswith("{")][-1])
    results = summary["results"]
    methods = list(results)
    categories = list(results[methods[0]])
    goal = {"stacked", "dflash", "dspark"} <= set(methods)
    print("category".ljust(15) + "".join(f"{m:>32}" for m in methods)
          + ("   stacked/best  modeled" if goal else ""))  # fmt: skip
    for c in categories:
        cells = []
        for m in methods:
            r = results[m][c]
            modeled = r.get("modeled_speedup")
            cells.append(
                f"{r['tokens_per_second']:6.1f} {r['speedup']:5.2f}x"
                + (f" ({modeled:5.3f})" if modeled else "")
                + f" τ{r['tau']:5.2f}"
            )
        row = c.ljust(15) + "".join(f"{cell:>32}" for cell in cells)
        if goal:
            row += f"   {_against_best(results, c):12}  {_modeled_against_best(results, c)}"
        print(row)


def _against_best(results: dict, category: str) -> str:
    stacked = results["stacked"][category]
    singles = [results[m][category] for m in ("dflash", "dspark")]
    best = max(r["tokens_per_second"] for r in singles)
    same = any(
        r["acceptance_histogram"] == stacked["acceptance_histogram"]
        and r["steps"] == stacked["steps"]
        for r in singles
    )
    return f"{stacked['tokens_per_second'] / best:.3f}" + (" =" if same else "")


def _modeled_against_best(results: dict, category: str) -> str:
    rates = [results[m][category].get("modeled_tokens_per_second") for m in MODELED]
    if not all(rates):
        return "-"
    return f"{rates[0] / max(rates[1:]):.4f}"


if __name__ == "__main__":
    main()
