"""Decoding speed by torch thread count, on an idle machine and beside busy processes.

    python benchmarks/threads_under_load.py [--tokens 64] [--rounds 2]

Each configuration runs in a fresh process (OpenMP reads its settings once): plain AR on
the default model, 3 prompts, greedy, fp32. `specgen default` is what the CLI does now
(GOMP_SPINCOUNT=3000, set by `import specgen`); `threads=cores` is libgomp's own default.
The load is N processes spinning on a core each. Prints tokens/s per (load, configuration),
rounds interleaved, and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import time

CONFIGS = {  # name -> environment (specgen is imported before torch, as the CLI does)
    "specgen default": {},
    "threads=cores": {"GOMP_SPINCOUNT": "300000"},  # libgomp's own default
    "threads=1": {"SPECGEN_THREADS": "1"},
    "passive wait": {"OMP_WAIT_POLICY": "PASSIVE"},
    "spin 1k": {"GOMP_SPINCOUNT": "1000"},
    "spin 3k": {"GOMP_SPINCOUNT": "3000"},
    "spin 10k": {"GOMP_SPINCOUNT": "10000"},
    "spin 100k": {"GOMP_SPINCOUNT": "100000"},
}
WORKER = r"""
import os, sys, time
import specgen
import torch
n = os.environ.get("SPECGEN_THREADS")
if n: torch.set_num_threads(int(n))
from specgen.cli.common import quiet_libraries
from specgen.api.pipeline import Pipeline
quiet_libraries()
pipe = Pipeline.load(device="cpu", dtype="float32")
pipe.generate("Hello", max_new_tokens=8)
tokens = seconds = 0
for p in ("Why is the sky blue?", "Explain how a bicycle works.", "Write a short poem."):
    s = pipe.generate(p, max_new_tokens=int(sys.argv[1]), session=pipe.new_session()).stats
    tokens += s.new_tokens - 1
    seconds += s.seconds - s.ttft_seconds
print(tokens / seconds, torch.get_num_threads())
"""


def _spin() -> None:
    while True:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loads", default="0,1,2")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {}
    for load in (int(x) for x in args.loads.split(",")):
        spinners = [mp.Process(target=_spin, daemon=True) for _ in range(load)]
        for s in spinners:
            s.start()
        time.sleep(1)
        row = results.setdefault(f"load={load}", {})
        for r in range(args.rounds):
            chosen = args.configs.split(",")
            names = chosen if r % 2 == 0 else chosen[::-1]
            for name in names:
                env = {**os.environ, **CONFIGS[name]}
                out = subprocess.run(
                    [sys.executable, "-c", WORKER, str(args.tokens)],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()
                row.setdefault(name, []).append(float(out[0]))
                print(
                    f"load={load} {name:14s} threads={out[1]} {float(out[0]):6.1f} tok/s",
                    flush=True,
                )
        for s in spinners:
            s.terminate()
    for load, row in results.items():
        print(load, "  ".join(f"{n}: {statistics.median(v):.1f}" for n, v in row.items()))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
