"""What a verify block costs against a decode step, on the embedded default's packed target.

    python benchmarks/verify_rows.py [--rows 1,2,4,8,12,16] [--repeats 40] [--context 128]
                                     [--acts fp32,q8]
    SPECGEN_CPU_ISA=avx2 python benchmarks/verify_rows.py   # the 8-lane products, same machine

A speculative step verifies 1 + l tokens in one forward; it pays only when that forward costs
little more than a one-token step. Each block size is timed in turn, sweep after sweep, at
the same context (rolled back), keeping the fastest run of each (interference only adds
time); the thread count is held fixed so the tuner does not move between sizes. With several
`--acts` (what the packed products multiply: fp32 activations, or 8-bit ones) every sweep
times each in turn on the same fused pass, so their ratios come from the same minutes of the
machine. Prints a table per activation kind, their ratio, and a JSON line.
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
    ap.add_argument("--acts", default="fp32,q8", help="activation kinds: fp32, q8 (or one)")
    ap.add_argument("--threads", type=int, help="default: torch's count")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: the calling thread's CPU time (with --threads 1: a busy "
                    "machine's other processes then cost waits on memory, not whole time "
                    "slices)")  # fmt: skip
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu counts the calling thread only: give --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("SPECGEN_CPU_THREADS", "fixed")

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.kernels.packed import ACTIVATIONS, kernel_isa, kernel_lanes
    from specgen.models.fused.cpu_pass import FusedPass

    quiet_libraries()
    model = Pipeline.load(args.model).model
    sizes = [int(r) for r in args.rows.split(",")]
    gen = torch.Generator().manual_seed(0)
    vocab = model.args.vocab_size
    cache = model.new_cache(args.context + max(sizes), steps=max(sizes))
    model(torch.randint(0, vocab, (1, args.context), generator=gen), cache)
    blocks = {n: torch.randint(0, vocab, (1, n), generator=gen) for n in sizes}
    acts = args.acts.split(",")
    fused = FusedPass.of(model)  # None: the eager layers (they read SPECGEN_CPU_ACT per call)
    best = {a: dict.fromkeys(sizes, float("inf")) for a in acts}
    for sweep in range(args.repeats + 1):
        for act in acts:
            os.environ["SPECGEN_CPU_ACT"] = act
            if fused is not None:  # the same pass, its products told what to multiply
                fused.model.act = ACTIVATIONS[act]
                key = model.__dict__["_fused"][0]  # (generation, wanted, acts, kv kind)
                model.__dict__["_fused"] = (key[:2] + (act,) + key[3:], fused)
            for n in sizes:
                start = clock()
                model(blocks[n], cache)
                if sweep:  # the first sweep warms up
                    best[act][n] = min(best[act][n], clock() - start)
                cache.rollback(args.context)
    lanes, threads = kernel_lanes(), torch.get_num_threads()
    kind = "fused" if fused else "eager"
    print(f"{args.model}, {threads} threads, {kernel_isa()}: fp32 products in {lanes} lanes, "
          f"context {args.context}, {kind} pass, {args.clock} time")  # fmt: skip
    first = best[acts[0]][sizes[0]]
    for act in acts:
        b = best[act]
        print(f"  {act}:")
        for n in sizes:
            vs = f"  {b[n] / first:5.2f}x {acts[0]} 1 row" if act != acts[0] else ""
            print(f"  {n:3d} rows: {b[n] * 1e3:6.2f} ms  {b[n] / b[sizes[0]]:5.2f}x 1 row{vs}")
    out = {"isa": kernel_isa(), "lanes": lanes, "threads": threads, "context": args.context,
           "clock": args.clock}  # fmt: skip
    out["ms"] = {a: {str(n): round(best[a][n] * 1e3, 3) for n in sizes} for a in acts}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
