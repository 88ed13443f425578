"""What a verify block costs against a decode step, on the embedded default's packed target.

    python benchmarks/verify_rows.py [--rows 1,2,4,8,12,16] [--repeats 40] [--context 128]
    SPECGEN_CPU_ISA=avx2 python benchmarks/verify_rows.py   # the 8-lane products, same machine

A speculative step verifies 1 + l tokens in one forward; it pays only when that forward costs
little more than a one-token step. Each block size is timed in turn, sweep after sweep, at
the same context (rolled back), keeping the fastest run of each (interference only adds
time); the thread count is held fixed so the tuner does not move between sizes. Prints the
table and a JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--rows", default="1,2,4,8,12,16")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--context", type=int, default=128)
    args = ap.parse_args()
    os.environ.setdefault("SPECGEN_CPU_THREADS", "fixed")

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.kernels.packed import kernel_lanes

    quiet_libraries()
    model = Pipeline.load(args.model).model
    sizes = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    vocab = model.args.vocab_size
    cache = model.new_cache(args.context + max(sizes), steps=max(sizes))
    model(torch.randint(0, vocab, (1, args.context), generator=gen), cache)
    blocks = {n: torch.randint(0, vocab, (1, n), generator=gen) for n in sizes}
    best = dict.fromkeys(sizes, float("inf"))
    for sweep in range(args.repeats + 1):
        for n in sizes:
            start = time.perf_counter()
            model(blocks[n], cache)
            if sweep:  # the first sweep warms up
                best[n] = min(best[n], time.perf_counter() - start)
            cache.rollback(args.context)
    lanes, threads = kernel_lanes(), torch.get_num_threads()
    print(f"{args.model}, {threads} threads, products in {lanes} lanes, context {args.context}")
    for n in sizes:
        print(f"  {n:3d} rows: {best[n] * 1e3:6.2f} ms  {best[n] / best[sizes[0]]:5.2f}x")
    out = {"lanes": lanes, "threads": threads, "context": args.context}
    out["ms"] = {str(n): round(best[n] * 1e3, 3) for n in sizes}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
