"""specgen AR and transformers `generate` side by side beside 0, 1, 2 and 4 busy processes
(and llama.cpp on the same GGUF file, when llama-cpp-python is installed).

    python benchmarks/busy_ar_vs_transformers.py [--loads 0,1,2,4] [--rounds 2] [--tokens 48] \
        [--fixed]

What a user sees on a shared machine: the embedded default (specgen: its packed GGUF as it
runs by default; transformers: the same file dequantized to fp32, as transformers reads
it; llama.cpp: the file itself, with as many threads as specgen takes, os.cpu_count(),
since its own default is half the cores), 3 prompts, greedy, each engine otherwise with
its own defaults. Every run is a fresh process
(OpenMP reads its settings once) and the two engines alternate which goes first. The load
is N processes spinning on a core each, started before and stopped after each load level
(daemons, so they never outlive the benchmark). Prints decode tokens/s and the ratio per
load; the last line is JSON.
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

PROMPTS = ("Why is the sky blue?", "Explain how a bicycle works.", "Write a short poem.")
SPECGEN = r"""
import sys, time
import specgen
from specgen.cli.common import quiet_libraries
from specgen.api.pipeline import Pipeline
quiet_libraries()
pipe = Pipeline.load(device="cpu", dtype="float32")
pipe.generate("Hello", max_new_tokens=8)
tokens = seconds = 0
for p in PROMPTS:
    s = pipe.generate(p, max_new_tokens=int(sys.argv[1]), session=pipe.new_session()).stats
    tokens += s.new_tokens - 1
    seconds += s.seconds - s.ttft_seconds
print(tokens / seconds)
"""
TRANSFORMERS = r"""
import sys, time
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
def ids(p):
    chat = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True)
    return torch.tensor([chat if isinstance(chat, list) else chat["input_ids"]])
with torch.inference_mode():
    model.generate(ids("Hello"), max_new_tokens=8, do_sample=False)
    tokens = seconds = 0
    for p in PROMPTS:
        x = ids(p)
        t = time.perf_counter()
        model.generate(x, max_new_tokens=1, do_sample=False)  # the prefill alone, to subtract
        first = time.perf_counter() - t
        t = time.perf_counter()
        out = model.generate(x, max_new_tokens=int(sys.argv[1]), do_sample=False)
        seconds += time.perf_counter() - t - first
        tokens += out.shape[1] - x.shape[1] - 1
print(tokens / seconds)
"""


LLAMACPP = r"""
import os, sys, time
from llama_cpp import Llama
llm = Llama(model_path=sys.argv[2], n_ctx=1024, n_threads=os.cpu_count(), verbose=False)
def run(p, n):
    t = time.perf_counter()
    out = llm.create_chat_completion([{"role": "user", "content": p}], max_tokens=n,
                                     temperature=0.0)
    return time.perf_counter() - t, out["usage"]["completion_tokens"]
run("Hello", 8)
tokens = seconds = 0
for p in PROMPTS:
    llm.reset()  # no prompt cache between answers, as the other two
    first, _ = run(p, 1)  # the prefill alone, to subtract
    llm.reset()
    total, n = run(p, int(sys.argv[1]))
    seconds += total - first
    tokens += n - 1
print(tokens / seconds)
"""
ENGINES = {"specgen": SPECGEN, "transformers": TRANSFORMERS, "llama.cpp": LLAMACPP,
           "specgen-fixed": SPECGEN}  # fmt: skip
# specgen-fixed: every fused call with torch's thread count (before the counts were tuned)
ENV = {"specgen-fixed": {"SPECGEN_CPU_THREADS": "fixed"}}


def _spin() -> None:
    while True:
        pass


def _paths() -> dict[str, str]:
    """What each engine reads: specgen resolves the default itself; transformers the GGUF's
    dequantized copy; llama.cpp the GGUF file."""
    from specgen.hub import resolve_model
    from specgen.models.formats.gguf.convert import ensure_converted

    gguf = resolve_model("smollm2-135m").gguf
    return {"specgen": "", "specgen-fixed": "", "llama.cpp": str(gguf),
            "transformers": str(ensure_converted(gguf, weights=True))}  # fmt: skip


def _run(engine: str, tokens: int, path: str) -> float:
    code = f"PROMPTS = {PROMPTS!r}\n" + ENGINES[engine]
    out = subprocess.run(
        [sys.executable, "-c", code, str(tokens), path],
        env={**os.environ, **ENV.get(engine, {})},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--loads", default="0,1,2,4")
    parser.add_argument("--fixed", action="store_true",
                        help="also specgen with a fixed thread count (SPECGEN_CPU_THREADS=fixed)")
    args = parser.parse_args()
    paths = _paths()
    engines = ["specgen", "transformers"]
    try:
        import llama_cpp  # noqa: F401

        engines.append("llama.cpp")
    except ImportError:
        print("llama-cpp-python is not installed: specgen and transformers only", flush=True)
    if args.fixed:
        engines.append("specgen-fixed")
    results: dict[str, dict[str, list[float]]] = {}
    for load in (int(x) for x in args.loads.split(",")):
        spinners = [mp.Process(target=_spin, daemon=True) for _ in range(load)]
        for s in spinners:
            s.start()
        try:
            time.sleep(1)
            row = results.setdefault(f"load={load}", {})
            for r in range(args.rounds):
                for engine in engines[:: 1 if r % 2 == 0 else -1]:
                    tps = _run(engine, args.tokens, paths[engine])
                    row.setdefault(engine, []).append(tps)
                    print(f"load={load} {engine:12s} {tps:6.1f} tok/s", flush=True)
        finally:
            for s in spinners:
                s.terminate()
                s.join()
    summary = {}
    for load, row in results.items():
        medians = {engine: statistics.median(row[engine]) for engine in engines}
        ours = medians["specgen"]
        summary[load] = {engine: round(v, 1) for engine, v in medians.items()}
        summary[load].update({f"vs {e}": round(ours / medians[e], 2) for e in engines[1:]})
        print(f"{load}: " + ", ".join(f"{e} {v:.1f}" for e, v in medians.items()) + " tok/s; "
              + ", ".join(f"{ours / medians[e]:.2f}x {e}" for e in engines[1:]))
    print(json.dumps({"summary": summary, "runs": results}))


if __name__ == "__main__":
    main()
