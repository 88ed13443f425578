"""Where a decode step's time goes with packed weights: the matmuls or everything else.

    python benchmarks/packed_step_profile.py --threads 1,2

On the embedded default (packed through the eager torch layers, and dequantized for
comparison), one-token decode steps after a short prefill are timed (best of N) three
ways: as they run; with every matrix product replaced by an empty result of its shape
(what the rest of the step costs: norms, RoPE, attention, the Python around them); and the
products alone, each weight once on a random row. The fused CPU pass (how a packed target
runs by default) is timed whole beside them: it has no Python between its products to
take apart. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def best(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def no_products(x, out_features):
    return torch.empty(*x.shape[:-1], out_features)


def time_model(model, steps: int, whole_only: bool = False) -> dict:
    import specgen.kernels.packed as packed_kernels
    import specgen.models.formats.weights as weights_module
    from specgen.models.formats.weights import LinearWeight

    cache = model.new_cache(512)
    token = torch.tensor([[7]])
    model(torch.arange(10, 42).view(1, -1), cache)

    def step():
        model(token, cache)
        cache.rollback(32)  # the same context every step

    whole = best(step, steps)
    if whole_only:
        return {"step_ms": round(whole * 1e3, 2)}
    real = packed_kernels.packed_linear_cpu, weights_module.linear
    packed_kernels.packed_linear_cpu = lambda x, m: no_products(x, m.shape[0])
    weights_module.linear = lambda x, w, b: no_products(x, w.shape[0])
    try:
        rest = best(step, steps)
    finally:
        packed_kernels.packed_linear_cpu, weights_module.linear = real
    ws = list({id(m): m for m in model.modules() if isinstance(m, LinearWeight)}.values())
    xs = [torch.randn(1, w.shape[1]) for w in ws]
    products = best(lambda: [w(x) for w, x in zip(ws, xs, strict=True)], max(5, steps // 3))
    return {"step_ms": round(whole * 1e3, 2), "without_products_ms": round(rest * 1e3, 2),
            "products_alone_ms": round(products * 1e3, 2)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()

    from specgen.api.loader import load_target

    models = {
        "packed": load_target("smollm2-135m", device="cpu").model,
        "dequantized": load_target("smollm2-135m", device="cpu", dequantize=True).model,
    }
    import os

    report = {}
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        os.environ["SPECGEN_CPU_PASS"] = "fused"
        with torch.no_grad():
            fused = time_model(models["packed"], args.steps, True)
        report[f"packed-fused-{threads}t"] = fused
        print(f"packed-fused {threads} thread(s): step {fused['step_ms']:6.2f} ms", flush=True)
        os.environ["SPECGEN_CPU_PASS"] = "eager"
        for name, model in models.items():
            with torch.no_grad():
                row = time_model(model, args.steps)
            report[f"{name}-{threads}t"] = row
            print(f"{name:12} {threads} thread(s): step {row['step_ms']:6.2f} ms, without the "
                  f"products {row['without_products_ms']:5.2f} ms, products alone "
                  f"{row['products_alone_ms']:6.2f} ms", flush=True)  # fmt: skip
    print(json.dumps(report))


if __name__ == "__main__":
    main()
