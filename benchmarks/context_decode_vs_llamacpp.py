"""One decode step at growing context lengths: specgen (fused pass, eager layers) and
llama.cpp on the same GGUF, the same threads, in one run.

    pip install llama-cpp-python          # optional; never a test dependency
    python benchmarks/context_decode_vs_llamacpp.py --threads 2 --contexts 32,256,1000,1900

Each engine prefills the same token ids to the context length, then one more token is
decoded N times from that same context (specgen rolls its cache back; llama.cpp's KV
cache is trimmed to the context), best of N. Engines alternate per context length. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def best_ms(fn, n: int) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(min(times) * 1e3, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--contexts", default="32,256,1000,1900")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    import torch
    from llama_cpp import Llama

    from specgen.api.loader import load_target
    from specgen.hub import embedded_gguf
    from specgen.registry import DEFAULT_ALIAS, MODELS

    torch.set_num_threads(args.threads)
    contexts = [int(c) for c in args.contexts.split(",")]
    model = load_target(DEFAULT_ALIAS, device="cpu").model
    llm = Llama(model_path=str(embedded_gguf(MODELS[DEFAULT_ALIAS])), n_threads=args.threads,
                n_threads_batch=args.threads, n_ctx=max(contexts) + 8, verbose=False)  # fmt: skip

    def specgen_step(mode: str, length: int) -> float:
        os.environ["SPECGEN_CPU_PASS"] = mode
        cache = model.new_cache(max(contexts) + 8)
        model(torch.arange(100, 100 + length).view(1, -1), cache, num_logits=1)

        def step():
            model(torch.tensor([[7]]), cache)
            cache.rollback(length)

        return best_ms(step, args.steps)

    def llama_step(length: int) -> float:
        llm.reset()
        llm.eval(list(range(100, 100 + length)))

        def step():
            llm.eval([7])
            llm.n_tokens = length  # llama-cpp-python trims its KV cache to n_tokens

        return best_ms(step, args.steps)

    report = {}
    print(f"{'context':>8}{'fused ms':>10}{'eager ms':>10}{'llama.cpp':>11}{'fused x llama':>15}")
    for i, length in enumerate(contexts):
        runs = {
            "fused": lambda n=length: specgen_step("fused", n),
            "eager": lambda n=length: specgen_step("eager", n),
            "llama.cpp": lambda n=length: llama_step(n),
        }
        order = list(runs)[i % 3 :] + list(runs)[: i % 3]
        row = {name: runs[name]() for name in order}
        report[length] = row
        print(f"{length:>8}{row['fused']:>10}{row['eager']:>10}{row['llama.cpp']:>11}"
              f"{row['llama.cpp'] / row['fused']:>15.2f}")  # fmt: skip
    os.environ["SPECGEN_CPU_PASS"] = "fused"
    print(json.dumps({"threads": args.threads, "ms_per_step": report}))


if __name__ == "__main__":
    main()
