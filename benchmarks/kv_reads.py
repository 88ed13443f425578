"""What keeping keys and values as fp16 saves: the fused CPU pass with fp32 and with fp16
keys and values, side by side in one process, call by call.

    python benchmarks/kv_reads.py [--calls 40]

On the embedded default: the pass built once for each kind (SPECGEN_CPU_KV set while it is
built), caches of each kind filled with the same tokens, then each shape's calls
alternating between the kinds, so both see the same machine from moment to moment (one
process per kind, one after the other, moved 20-30% on this VM and once showed fp16 25%
slower at context 100, where side by side it is not). Shapes: one answer's pass of 1, 8
and 64 rows after 100, 1000 and 2000 cached positions, and one pass of 8 answers x 1 row,
each answer its own cache, at 100, 500 and 1000 positions; the median of --calls each.
Timings only: the answers the two kinds give are each held to their model in
tests/test_fused_cpu.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

KINDS = ("f32", "f16")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    args = ap.parse_args()
    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.models.fused.cpu_pass import FusedPass

    quiet_libraries()
    model = Pipeline.load("smollm2-135m").model
    passes = {}
    for kind in KINDS:  # each kind's pass, kept: FusedPass.of rebuilds on a change of kind
        os.environ["SPECGEN_CPU_KV"] = kind
        passes[kind] = FusedPass.of(model)

    def filled(n: int, kind: str):
        os.environ["SPECGEN_CPU_KV"] = kind  # the cache's dtype, and the pass that fills it
        cache = model.new_cache(2100)
        x = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
        for s in range(0, n, 500):
            model(x[:, s : s + 500], cache)
        return cache

    def race(label: str, context: int, parts_of) -> None:
        caches = {k: [filled(context, k) for _ in range(8)] for k in KINDS}
        times: dict[str, list[float]] = {k: [] for k in KINDS}
        for _ in range(args.calls):
            for kind in KINDS:
                parts = parts_of(caches[kind])
                start = time.perf_counter()
                passes[kind].run_many(model, parts, ())
                times[kind].append(time.perf_counter() - start)
                for cache in caches[kind]:
                    cache.rollback(context)
        f32, f16 = (statistics.median(times[k]) * 1e3 for k in KINDS)
        print(f"  {label:>8} at {context:4}: f32 {f32:7.2f} ms  f16 {f16:7.2f} ms  "
              f"{f16 / f32:.2f}x", flush=True)  # fmt: skip

    for context in (100, 1000, 2000):
        for rows in (1, 8, 64):
            race(f"{rows} rows", context, lambda cs, rows=rows: [([5] * rows, cs[0], 1)])
    for context in (100, 500, 1000):
        race("8 answers", context, lambda cs: [([5], c, 1) for c in cs])


if __name__ == "__main__":
    main()
