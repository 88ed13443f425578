"""specgen AR vs transformers `generate`: same model, dtype, prompts, greedy; side by side.

    python benchmarks/ar_vs_transformers.py --dtypes float32,bfloat16 --num-prompts 10

For each dtype both engines warm up once, then answer every prompt, alternating which
goes first so drift on a noisy machine hits both. Reported per dtype: tokens/s of each
(tokens / wall time of the whole call, prefill included, Spec-Bench style), the ratio,
and how many prompts produced token-identical output. The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"


def load_prompts(path: Path, n: int) -> list[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] if "turns" in r else r["prompt"] for r in rows][:n]


def reference_model(model_dir: Path, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()


def run_transformers(model, ids: list[int], max_new: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=max_new, do_sample=False)
    return out[0, len(ids) :].tolist(), time.perf_counter() - start


def run_specgen(pipe, ids: list[int], max_new: int, stop: int) -> tuple[list[int], float]:
    start = time.perf_counter()
    tokens: list[int] = []
    finish = None
    for chunk in pipe.stream_ids(ids, max_new_tokens=max_new, session=pipe.new_session()):
        tokens.extend(chunk.token_ids)
        finish = chunk.stats.finish_reason
    # transformers returns the stop token it generated; count and compare it the same way
    return tokens + ([stop] if finish == "stop" else []), time.perf_counter() - start


def bench_dtype(model: str, dtype_name: str, prompts: list[str], max_new: int) -> dict:
    from specgen.api.pipeline import Pipeline
    from specgen.core.device import DTYPES

    pipe = Pipeline.load(model, device="cpu", dtype=dtype_name)
    ref = reference_model(pipe_dir(model), DTYPES[dtype_name])
    stop = ref.generation_config.eos_token_id
    stop = stop[0] if isinstance(stop, list) else stop
    encoded = [pipe.encode(p) for p in prompts]
    run_specgen(pipe, encoded[0], 8, stop)  # warm-up: allocator, thread pools, caches
    run_transformers(ref, encoded[0], 8)
    rows = []
    for i, ids in enumerate(encoded):
        order = ("specgen", "transformers") if i % 2 == 0 else ("transformers", "specgen")
        result = {}
        for engine in order:
            if engine == "specgen":
                result[engine] = run_specgen(pipe, ids, max_new, stop)
            else:
                result[engine] = run_transformers(ref, ids, max_new)
        (ours, t_ours), (theirs, t_theirs) = result["specgen"], result["transformers"]
        rows.append(
            {
                "prompt_tokens": len(ids),
                "new_tokens": len(theirs),
                "specgen_tps": len(ours) / t_ours,
                "transformers_tps": len(theirs) / t_theirs,
                "identical": ours == theirs,
                "tokens": (ours, theirs),
            }
        )
        print(
            f"  [{dtype_name}] prompt {i + 1}/{len(encoded)}: {len(ids)} + {len(theirs)} tokens, "
            f"specgen {rows[-1]['specgen_tps']:.1f} tok/s, "
            f"transformers {rows[-1]['transformers_tps']:.1f} tok/s, "
            f"identical={rows[-1]['identical']}",
            file=sys.stderr,
        )
    total_ours = sum(r["new_tokens"] for r in rows)  # identical lengths when identical
    ours_tps = statistics.mean(r["specgen_tps"] for r in rows)
    theirs_tps = statistics.mean(r["transformers_tps"] for r in rows)
    return {
        "dtype": dtype_name,
        "prompts": len(rows),
        "new_tokens": total_ours,
        "specgen_tokens_per_second": round(ours_tps, 2),
        "transformers_tokens_per_second": round(theirs_tps, 2),
        "speedup": round(ours_tps / theirs_tps, 3),
        "identical_outputs": sum(r["identical"] for r in rows),
        "outputs": [r["tokens"] for r in rows],  # (specgen, transformers) per prompt
    }


def pipe_dir(model: str) -> Path:
    from specgen.hub import resolve_model

    return resolve_model(model).path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--prompts", type=Path, default=SAMPLE)
    parser.add_argument("--num-prompts", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()

    from specgen.cli.common import quiet_libraries

    quiet_libraries()
    prompts = load_prompts(args.prompts, args.num_prompts)
    results = [
        bench_dtype(args.model, d, prompts, args.max_new_tokens) for d in args.dtypes.split(",")
    ]
    exact = next((r for r in results if r["dtype"] == "float32"), None)
    reference = [ours for ours, _ in exact["outputs"]] if exact else None
    for r in results:
        outputs = r.pop("outputs")
        if reference is not None and r is not exact:
            # Half precision cannot promise fp32's tokens (near-ties flip); say how often
            # each engine still produces them.
            pairs = list(zip(outputs, reference, strict=True))
            r["specgen_matches_fp32"] = sum(ours == ref for (ours, _), ref in pairs)
            r["transformers_matches_fp32"] = sum(theirs == ref for (_, theirs), ref in pairs)
    header = ("dtype", "specgen tok/s", "transformers tok/s", "ratio", "identical")
    print(f"{header[0]:<10} {header[1]:>14} {header[2]:>19} {header[3]:>7} {header[4]:>10}")
    for r in results:
        line = (
            f"{r['dtype']:<10} {r['specgen_tokens_per_second']:>14.2f} "
            f"{r['transformers_tokens_per_second']:>19.2f} {r['speedup']:>6.2f}x "
            f"{r['identical_outputs']:>6}/{r['prompts']}"
        )
        if "specgen_matches_fp32" in r:
            line += (
                f"   same tokens as fp32: specgen {r['specgen_matches_fp32']}/{r['prompts']},"
                f" transformers {r['transformers_matches_fp32']}/{r['prompts']}"
            )
        print(line)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "model": args.model}
    print(json.dumps({"benchmark": "ar_vs_transformers", **meta, "results": results}))


if __name__ == "__main__":
    main()
