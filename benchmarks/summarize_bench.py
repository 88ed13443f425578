"""Print a `specgen bench --json` run as one row per category: tok/s, speedup and τ of
every method side by side (the JSON is the bench output's last line).

    python benchmarks/summarize_bench.py bench-output.txt
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
    summary = json.loads([line for line in lines if line.startswith("{")][-1])
    results = summary["results"]
    methods = list(results)
    categories = list(results[methods[0]])
    print("category".ljust(15) + "".join(f"{m:>24}" for m in methods))
    for c in categories:
        cells = []
        for m in methods:
            r = results[m][c]
            cells.append(f"{r['tokens_per_second']:6.1f} {r['speedup']:5.2f}x τ{r['tau']:5.2f}")
        print(c.ljust(15) + "".join(f"{cell:>24}" for cell in cells))


if __name__ == "__main__":
    main()
