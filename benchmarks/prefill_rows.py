"""A prompt read in one pass of the fused CPU pass, by its rows, with and without AMX tiles.

    python benchmarks/prefill_rows.py --rows 16,64,256 --seconds 5

Each row count reads N new tokens into an empty cache of the embedded default through
`FusedPass.run_many` (what a prompt's chunk costs), in a fresh process per setting of
SPECGEN_CPU_AMX (1: the amx build's tiles where the CPU has them, 0: the vector kernel),
the two alternating --rounds times so both see the same machine load. Reported: the fastest
pass of each and the ratio. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

WORKER = r"""
import json, sys, time
import torch
from specgen.api.pipeline import Pipeline
from specgen.cli.common import quiet_libraries
from specgen.kernels.library import amx, kernel_isa
from specgen.models.fused.cpu_pass import FusedPass
quiet_libraries()
rows, seconds = [int(r) for r in sys.argv[1].split(",")], float(sys.argv[2])
pipe = Pipeline.load("smollm2-135m", device="cpu")
model = pipe.model
fused = FusedPass.of(model)
out = {"isa": kernel_isa(), "amx": amx(), "ms": {}}
for n in rows:
    ids = torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(n)).tolist()
    best, start = float("inf"), time.perf_counter()
    while time.perf_counter() - start < seconds:
        cache = model.new_cache(max(1024, n))
        t = time.perf_counter()
        fused.run_many(model, [(ids, cache, 1)], ())
        best = min(best, time.perf_counter() - t)
    out["ms"][n] = 1e3 * best
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="16,64,256")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    best: dict[str, dict[str, float]] = {"1": {}, "0": {}}
    for _ in range(args.rounds):
        for flag in ("1", "0"):
            env = {**os.environ, "SPECGEN_CPU_AMX": flag}
            done = subprocess.run([sys.executable, "-c", WORKER, args.rows, str(args.seconds)],
                                  env=env, capture_output=True, text=True, check=True)  # fmt: skip
            got = json.loads(done.stdout.strip().splitlines()[-1])
            print(f"SPECGEN_CPU_AMX={flag} ({got['isa']}, tiles {'on' if got['amx'] else 'off'}):",
                  ", ".join(f"{n} rows {ms:.1f} ms" for n, ms in got["ms"].items()))  # fmt: skip
            for n, ms in got["ms"].items():
                best[flag][n] = min(ms, best[flag].get(n, float("inf")))
    for n in best["1"]:
        print(f"{n} rows: tiles {best['1'][n]:.1f} ms, vectors {best['0'][n]:.1f} ms, "
              f"x{best['0'][n] / best['1'][n]:.2f}")  # fmt: skip
    print(json.dumps(best))


if __name__ == "__main__":
    main()
