"""A/B in one process: the cost scheduler pricing a confidence-trimmed drafter (DSpark, and
DSpark inside stacked) by its steps as verified (`RealisedSteps`, "new") or by its
per-position rates ("old": MIN_WEIGHT set out of reach), interleaved prompt by prompt with
AR in the sync loop, on the embedded default. Every answer must equal AR's.

  python benchmarks/realised_pick_ab.py --categories math_reasoning,math,reasoning,coding \
      --per-category 3 --methods dspark,stacked
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import specgen.scheduling.acceptance as acceptance
from specgen.config import SpecConfig
from specgen.pipeline import Pipeline

ON = acceptance.MIN_WEIGHT


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--suite", type=Path, default=Path("../shared/data/spec_bench.jsonl"))
    ap.add_argument("--categories", default="math_reasoning,math,reasoning,coding")
    ap.add_argument("--per-category", type=int, default=3)
    ap.add_argument("--methods", default="dspark,stacked")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    args = ap.parse_args()

    rows = [json.loads(line) for line in args.suite.read_text().splitlines() if line.strip()]
    prompts = [
        row["turns"][0]
        for category in args.categories.split(",")
        for row in [r for r in rows if r.get("category") == category][: args.per_category]
    ]
    base = Pipeline.load("smollm2-135m", device="cpu", dtype="float32")
    pipes = {("ar", ""): base}
    for method in args.methods.split(","):
        for variant in ("new", "old"):
            pipes[(method, variant)] = base.with_spec(SpecConfig(method=method, engine="sync"))

    def run(key: tuple[str, str], text: str, tokens: int):
        acceptance.MIN_WEIGHT = ON if key[1] != "old" else float("inf")
        start = time.perf_counter()
        out = pipes[key].generate(text, max_new_tokens=tokens)
        return time.perf_counter() - start, out

    for key in pipes:  # warm-up
        run(key, "Hello", 8)
    seconds = dict.fromkeys(pipes, 0.0)
    tokens = dict.fromkeys(pipes, 0)
    chosen: dict[tuple[str, str], dict[str, list[int]]] = {}
    keys = list(pipes)
    for i, text in enumerate(prompts):
        answers = {}
        for key in keys if i % 2 == 0 else keys[::-1]:
            dt, out = run(key, text, args.max_new_tokens)
            seconds[key] += dt
            tokens[key] += len(out.token_ids)
            answers[key] = out.token_ids
            for name, (steps, accepted) in (out.stats.by_drafter or {}).items():
                row = chosen.setdefault(key, {}).setdefault(name, [0, 0])
                row[0] += steps
                row[1] += accepted
        if any(a != answers[("ar", "")] for a in answers.values()):
            raise SystemExit(f"prompt {i}: an answer differs from AR's")
    ar = tokens[("ar", "")] / seconds[("ar", "")]
    print(f"{len(prompts)} prompts, every answer identical to AR's")
    for key in keys:
        rate = tokens[key] / seconds[key]
        drafters = chosen.get(key, "")
        print(f"{key[0]:8s} {key[1]:4s} {rate:6.2f} tok/s  {rate / ar:.3f}x  {drafters}")


if __name__ == "__main__":
    main()
