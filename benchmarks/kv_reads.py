"""What keeping keys and values as fp16 saves: the fused CPU pass timed with
SPECGEN_CPU_KV=f32 and f16 in turn, on the embedded default, one process per kind and round.

    python benchmarks/kv_reads.py [--rounds 2]

Per kind: one answer's pass of 1, 8 and 64 rows after 100, 1000 and 2000 cached positions
(the best of a few hundred calls), and one pass of 8 answers x 1 row, each answer its own
cache, at 100, 500 and 1000 positions (the median of 60). Timings only: the answers the two
kinds give are each held to their model in tests/test_fused_cpu.py.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

WORKER = r"""
import statistics, time, torch
from specgen.api.pipeline import Pipeline
from specgen.cli.common import quiet_libraries
from specgen.models.fused.cpu_pass import FusedPass
quiet_libraries()
m = Pipeline.load("smollm2-135m").model
fp = FusedPass.of(m)

def filled(n):
    c = m.new_cache(2100)
    x = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
    for s in range(0, n, 500):
        m(x[:, s:s + 500], c)
    return c

for ctx in (100, 1000, 2000):
    c = filled(ctx)
    for rows in (1, 8, 64):
        best, t0 = 9.0, time.perf_counter()
        while time.perf_counter() - t0 < 2:
            t = time.perf_counter()
            fp.run_many(m, [([5] * rows, c, 1)], ())
            best = min(best, time.perf_counter() - t)
        print(f"  {rows:2} rows after {ctx:4}: {1e3 * best:7.2f} ms", flush=True)
for ctx in (100, 500, 1000):
    caches = [filled(ctx) for _ in range(8)]
    ts = []
    for _ in range(60):
        t = time.perf_counter()
        fp.run_many(m, [([5], c, 1) for c in caches], ())
        ts.append(time.perf_counter() - t)
    print(f"  8 answers at {ctx:4}: {1e3 * statistics.median(ts):7.2f} ms", flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    for r in range(args.rounds):
        for kind in ("f32", "f16"):
            print(f"round {r}, SPECGEN_CPU_KV={kind}", flush=True)
            env = {**os.environ, "SPECGEN_CPU_KV": kind}
            subprocess.run([sys.executable, "-c", WORKER], env=env, check=True)


if __name__ == "__main__":
    main()
