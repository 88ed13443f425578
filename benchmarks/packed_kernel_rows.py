"""The packed CPU kernel's two paths, by the number of rows multiplied at once.

    python benchmarks/packed_kernel_rows.py [--threads 1] [--repeats 30]

A decode step multiplies one row, a verify block up to 16, a prefill hundreds. The kernel
either unpacks each column into registers and uses it at once (direct) or unpacks blocks of
columns into scratch and runs every row over them (scratch); kernels/packed.DIRECT_ROWS is
where it switches. Both paths give the same bits (tests/test_packed.py), so the choice is
speed alone. Matrices of the embedded default's MLP shape (1536 x 576), 4-bit with offsets
and 8-bit, several of them so the weights come from memory as in a real step. Best of N
(robust to a busy machine); the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--rows", default="1,2,4,8,16,32,128")
    args = ap.parse_args()

    from specgen.kernels.packed import DIRECT_ROWS, packed_linear_cpu
    from specgen.models.formats.packed_matrix import quantize

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    n, k = 1536, 576
    report = {"threads": args.threads, "direct_rows": DIRECT_ROWS, "shape": [n, k], "rows": {}}
    for bits in (4, 8):
        mats = [quantize(torch.randn(n, k), bits, 32) for _ in range(8)]
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, k)
            best = {"direct": float("inf"), "scratch": float("inf")}
            for _ in range(args.repeats):
                for path, direct_rows in (("direct", 1 << 30), ("scratch", 0)):
                    t = time.perf_counter()
                    for m in mats:
                        packed_linear_cpu(x, m, direct_rows=direct_rows)
                    best[path] = min(best[path], time.perf_counter() - t)
            rate = {p: round(rows * n * k * len(mats) / s / 1e9, 2) for p, s in best.items()}
            report["rows"][f"int{bits}-{rows}"] = rate
            print(f"int{bits} {rows:4d} rows: direct {rate['direct']:6.2f}, scratch "
                  f"{rate['scratch']:6.2f} G row-weights/s", flush=True)  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
