"""Speculative methods vs plain AR in the same engine, side by side, per Spec-Bench category.

    python benchmarks/methods_vs_ar.py --methods ngram --categories summarization,rag

For every prompt each engine (AR first or last, alternating) answers greedily from a fresh
session; reported per category and method: tokens/s over the whole call (prefill included,
Spec-Bench style) and over decoding only (after the first token), the speedups vs AR, τ
(accepted drafts + 1 bonus per step, so AR = 1), and how many answers were token-identical
to AR. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parents[1] / "shared" / "data" / "spec_bench.jsonl"
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"


def load_prompts(path: Path, categories: list[str], n: int) -> dict[str, list[str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {c: [r["turns"][0] for r in rows if r.get("category") == c][:n] for c in categories}


def run(pipe, ids: list[int], max_new: int) -> dict:
    tokens, stats = [], None
    for chunk in pipe.stream_ids(ids, max_new_tokens=max_new, session=pipe.new_session()):
        tokens.extend(chunk.token_ids)
        stats = chunk.stats
    decode_seconds = stats.seconds - (stats.ttft_seconds or 0.0)
    return {
        "tokens": tokens,
        "tps": stats.new_tokens / stats.seconds,
        "decode_tps": (stats.new_tokens - 1) / decode_seconds if decode_seconds > 0 else 0.0,
        "tau": stats.acceptance_length,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="ngram")
    parser.add_argument("--categories", default="summarization,rag")
    parser.add_argument("--prompts", type=Path, default=SHARED if SHARED.is_file() else SAMPLE)
    parser.add_argument("--num-prompts", type=int, default=10, help="per category")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument(
        "--no-schedule", action="store_true", help="verify every draft whole (no scheduler)"
    )
    parser.add_argument("--verify-policy", default="cost", help="cost, full or threshold=X")
    parser.add_argument(
        "--drafter",
        action="append",
        default=[],
        metavar="METHOD=DIR",
        help="drafter checkpoint for a method (e.g. dspark=path/to/drafter); repeatable",
    )
    args = parser.parse_args()
    drafters = dict(d.split("=", 1) for d in args.drafter)

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.core.config import SpecConfig

    quiet_libraries()
    base = Pipeline.load(args.model, dtype=args.dtype)
    engines = {"ar": base}
    for method in args.methods.split(","):
        policy = "full" if args.no_schedule else args.verify_policy
        spec = SpecConfig(method=method, drafter=drafters.get(method), verify_policy=policy)
        engines[method] = base.with_spec(spec)
    prompts = load_prompts(args.prompts, args.categories.split(","), args.num_prompts)
    run(base, base.encode("Hello"), 4)  # warm-up

    results = []
    for category, texts in prompts.items():
        rows: dict[str, list[dict]] = {name: [] for name in engines}
        for i, text in enumerate(texts):
            ids = base.encode(text)
            order = list(engines) if i % 2 == 0 else list(reversed(engines))
            for name in order:
                rows[name].append(run(engines[name], ids, args.max_new_tokens))
            print(f"  {category} {i + 1}/{len(texts)}: {len(ids)} prompt tokens", file=sys.stderr)
        ar_tps = statistics.mean(r["tps"] for r in rows["ar"])
        ar_decode = statistics.mean(r["decode_tps"] for r in rows["ar"])
        for name in engines:
            if name == "ar":
                continue
            tps = statistics.mean(r["tps"] for r in rows[name])
            decode = statistics.mean(r["decode_tps"] for r in rows[name])
            same = sum(
                a["tokens"] == b["tokens"] for a, b in zip(rows["ar"], rows[name], strict=True)
            )
            results.append(
                {
                    "category": category,
                    "method": name,
                    "prompts": len(texts),
                    "tau": round(statistics.mean(r["tau"] for r in rows[name]), 3),
                    "ar_tokens_per_second": round(ar_tps, 2),
                    "tokens_per_second": round(tps, 2),
                    "speedup": round(tps / ar_tps, 3),
                    "ar_decode_tokens_per_second": round(ar_decode, 2),
                    "decode_tokens_per_second": round(decode, 2),
                    "decode_speedup": round(decode / ar_decode, 3),
                    "identical_to_ar": same,
                }
            )
    head = ("category", "method", "τ", "speedup", "decode speedup", "identical")
    print(f"{head[0]:<14} {head[1]:<8} {head[2]:>5} {head[3]:>8} {head[4]:>15} {head[5]:>10}")
    for r in results:
        print(
            f"{r['category']:<14} {r['method']:<8} {r['tau']:>5.2f} {r['speedup']:>7.2f}x "
            f"{r['decode_speedup']:>14.2f}x {r['identical_to_ar']:>6}/{r['prompts']}"
        )
    print("(τ = accepted draft tokens + 1 bonus per step; speedup includes the prefill)")
    print(json.dumps({"benchmark": "methods_vs_ar", "model": args.model, "results": results}))


if __name__ == "__main__":
    main()
