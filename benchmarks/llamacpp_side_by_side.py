"""specgen and llama.cpp on the same GGUF file, the same prompts, greedy, in one run.

    pip install llama-cpp-python          # optional; never a test dependency
    python benchmarks/llamacpp_side_by_side.py --threads 2 --max-new 96

Every prompt of the Spec-Bench sample goes, in turn, to llama.cpp (llama-cpp-python on the
embedded default's GGUF, or --gguf) and to each specgen configuration: AR on packed
weights, AR dequantized to fp32 (the old path), and each method on packed weights (and
dequantized; with --acceptance also verifying every draft whole, to check that the
drafters trained on the dequantized target accept as much on the packed one). The order
rotates per prompt so all see the same machine load; all get the same token ids
(specgen's chat template) and stop at the same length.

Reported per configuration: median decode tokens/s and its ratio to llama.cpp's, median
time to first token, acceptance length, and agreement: specgen's packed AR against its
dequantized AR (tokens that differ: near-ties only, as both compute the same model up to
fp32 summation) and llama.cpp against specgen's packed AR (llama.cpp rounds activations
to 8 bits, so agreement is reported, not expected). Memory: each side's weight bytes and
the file size. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"


def prompts(path: Path, limit: int | None) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows][:limit]


class LlamaCpp:
    def __init__(self, gguf: Path, threads: int, context: int) -> None:
        from llama_cpp import Llama

        self.llm = Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
                         n_ctx=context, verbose=False)  # fmt: skip
        self.eos = self.llm.token_eos()

    def weight_bytes(self) -> int:
        import llama_cpp

        return int(llama_cpp.llama_model_size(self.llm.model))

    def run(self, ids: list[int], max_new: int, stops: set[int]) -> dict:
        self.llm.reset()
        start = time.perf_counter()
        first, out = None, []
        for tok in self.llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0,
                                     reset=True):  # fmt: skip
            if first is None:
                first = time.perf_counter()
            if tok in stops:
                break
            out.append(tok)
            if len(out) >= max_new:
                break
        end = time.perf_counter()
        return {"tokens": out, "ttft": first - start, "decode_tps": _tps(len(out), first, end),
                "acceptance": None}  # fmt: skip


def _tps(n: int, first: float, end: float) -> float | None:
    return (n - 1) / (end - first) if n > 1 and end > first else None


class Specgen:
    def __init__(self, pipe, cpu_pass: str = "fused") -> None:
        self.pipe, self.cpu_pass = pipe, cpu_pass  # "eager": the packed target's torch layers

    def run(self, ids: list[int], max_new: int, stops: set[int]) -> dict:
        import os

        tokens, stats = [], None
        os.environ["SPECGEN_CPU_PASS"] = self.cpu_pass
        for chunk in self.pipe.stream_ids(ids, max_new_tokens=max_new,
                                          session=self.pipe.new_session()):  # fmt: skip
            tokens.extend(chunk.token_ids)
            stats = chunk.stats
        os.environ["SPECGEN_CPU_PASS"] = "fused"
        decode = stats.seconds - (stats.ttft_seconds or 0.0)
        tps = (stats.new_tokens - 1) / decode if stats.new_tokens > 1 and decode > 0 else None
        return {"tokens": tokens, "ttft": stats.ttft_seconds, "decode_tps": tps,
                "acceptance": stats.acceptance_length}  # fmt: skip


def agreement(a: list[int], b: list[int]) -> tuple[int, int, bool]:
    """(common prefix length, compared length, identical)."""
    n = min(len(a), len(b))
    prefix = next((i for i in range(n) if a[i] != b[i]), n)
    return prefix, max(len(a), len(b)), a == b


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, help="default: the embedded default's file")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=None, help="first N of the sample")
    ap.add_argument("--methods", default="dflash,dspark")
    ap.add_argument(
        "--no-dequantized-methods",
        action="store_true",
        help="skip the methods on the dequantized target (faster)",
    )
    ap.add_argument(
        "--acceptance",
        action="store_true",
        help="also each method verifying every draft whole (verify policy full), packed and "
        "dequantized: the drafters' own acceptance on each target",
    )
    ap.add_argument(
        "--eager",
        action="store_true",
        help="also AR on the packed target through its eager torch layers (the fused CPU "
        "pass's baseline)",
    )
    args = ap.parse_args()

    import torch

    from specgen import Pipeline, SpecConfig
    from specgen.hub import embedded_gguf
    from specgen.registry import DEFAULT_ALIAS, MODELS

    torch.set_num_threads(args.threads)
    gguf = args.gguf or embedded_gguf(MODELS[DEFAULT_ALIAS])
    model = str(args.gguf) if args.gguf else DEFAULT_ALIAS
    packed = Pipeline.load(model, device="cpu")
    dense = Pipeline.load(model, device="cpu", dequantize=True)
    runners = {"llama.cpp": LlamaCpp(gguf, args.threads, 4096),
               "ar": Specgen(packed), "ar-dequantized": Specgen(dense)}  # fmt: skip
    if args.eager:
        runners["ar-eager"] = Specgen(packed, "eager")
    for method in [m for m in args.methods.split(",") if m]:
        runners[method] = Specgen(packed.with_spec(SpecConfig(method=method)))
        if not args.no_dequantized_methods:
            runners[f"{method}-dequantized"] = Specgen(dense.with_spec(SpecConfig(method=method)))
        if args.acceptance:
            full = SpecConfig(method=method, verify_policy="full")
            runners[f"{method}-full"] = Specgen(packed.with_spec(full))
            runners[f"{method}-full-dequantized"] = Specgen(dense.with_spec(full))
    stops = set(packed.model.args.eos_token_ids)
    results: dict[str, list[dict]] = {name: [] for name in runners}
    names = list(runners)
    texts = prompts(SAMPLE, args.prompts)
    for warm in texts[:1]:  # one untimed answer each: compile, caches, cost tables
        for r in runners.values():
            r.run(packed.encode(warm), 8, stops)
    for i, text in enumerate(texts):
        ids = packed.encode(text)
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            results[name].append(runners[name].run(ids, args.max_new, stops))
        print(f"prompt {i + 1}/{len(texts)} done", file=sys.stderr, flush=True)

    base = statistics.median(r["decode_tps"] for r in results["llama.cpp"] if r["decode_tps"])
    summary = {"threads": args.threads, "max_new": args.max_new, "prompts": len(texts),
               "gguf": gguf.name, "file_bytes": gguf.stat().st_size,
               "weight_bytes": {"llama.cpp": runners["llama.cpp"].weight_bytes(),
                                "specgen-packed": packed.model.resident_bytes,
                                "specgen-dequantized": dense.model.resident_bytes},
               "configs": {}}  # fmt: skip
    print(f"{'config':<22}{'tok/s':>8}{'x llama':>9}{'ttft s':>8}{'tau':>6}  agreement")
    for name, rs in results.items():
        tps = statistics.median(r["decode_tps"] for r in rs if r["decode_tps"])
        ttft = statistics.median(r["ttft"] for r in rs)
        taus = [r["acceptance"] for r in rs if r["acceptance"]]
        tau = statistics.mean(taus) if taus else None
        ref = "ar-dequantized" if name in ("ar", "ar-eager") else "ar"
        agree = [agreement(r["tokens"], o["tokens"]) for r, o in zip(rs, results[ref], strict=True)]
        same = sum(a[2] for a in agree)
        tokens_differing = sum(a[1] - a[0] for a in agree)
        row = {"decode_tps": round(tps, 2), "x_llama_cpp": round(tps / base, 3),
               "ttft_s": round(ttft, 4), "acceptance": tau and round(tau, 3),
               "identical_to": ref, "identical_answers": same,
               "tokens_after_first_difference": tokens_differing}  # fmt: skip
        summary["configs"][name] = row
        tau_s = f"{tau:6.2f}" if tau else "     -"
        print(
            f"{name:<22}{tps:8.1f}{tps / base:9.2f}{ttft:8.3f}{tau_s}  "
            f"{same}/{len(rs)} identical to {ref}, {tokens_differing} tokens after a difference"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
