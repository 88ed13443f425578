"""The bench's decisions and modeled speed under another machine's price list.

Whether a drafter pays is a matter of prices: on the 2-core CPU verifying one draft costs
~1.4 plain steps, so the cost scheduler rightly decodes almost plainly and dflash, dspark
and stacked all land within 1% of AR; there the stacked selector has nothing to choose
between. This runs `specgen bench`'s harness with every scheduler deciding from a given
price list instead of this machine's measured one: the drafters, their acceptance and the
tokens are real (greedy answers are still checked against AR), only the prices are
assumed. The modeled column (bench/modeled.py) then prices those decisions from the same
list. The measured tok/s of such a run mean nothing (the CPU pays its own prices for
decisions made for another machine's) and are not reported.

Prices are ratios to one plain decoding step:

    verify n drafts:  1 + SLOPE * n            (a forward over 1 + n tokens)
    draft (any length): DFLASH / DSPARK; a copy drafter's (ngram, suffix): COPY

The default, `h200-qwen3-8b`, is what benchmarks/results/gpu-h200-2026-11-30b/shapes.txt
measured on an H200 at Qwen3-8B shapes, context 512 (graphed verify of 16 tokens 1.18x AR,
so SLOPE = 0.18 / 15; DFlash draft 0.25 and DSpark draft 0.29 of an AR step, eager over
eager). For the default model on that GPU those ratios are an assumption: its own price
list was never recorded.

    python benchmarks/what_if_prices.py --suite benchmarks/prompts/spec_bench.jsonl \
        --num-prompts 52 > out.txt && python benchmarks/summarize_bench.py out.txt
"""

from __future__ import annotations

import argparse

PRESETS = {
    # slope per verified draft, DFlash draft, DSpark draft (ratios to an AR step)
    "h200-qwen3-8b": (0.18 / 15, 0.25, 0.29),
    # this 2-core CPU when quiet (docs/results.md: verifying 1 to 8 drafts 1.2x to 2.6x a
    # step, a DFlash draft 0.5x, DSpark's 0.55x after its Markov rows were kept)
    "cpu-2core-quiet": (0.2, 0.5, 0.55),
    # the same with extra rows as cheap as issue 44 aims for (research/wave4: a block of 8
    # rows near 1.3 steps with int8 activations): an assumption until it lands
    "cpu-int8-rows": (0.04, 0.5, 0.55),
}
COPY = 0.005  # a lookup (~0.1 ms measured) against a ~10 ms step


def priced_pipelines(pipes: dict, slope: float, drafts: dict) -> dict:
    """`pipes` deciding from the price list instead of their measured costs (ratios times
    this machine's measured plain step, so modeled tok/s keep plausible units)."""
    from specgen.scheduling.cost import CostTable

    tables = [p.costs for p in pipes.values() if getattr(p, "costs", None)]
    measured = tables[0]
    step = measured.seconds[0][0]
    longest = max(t.max_drafts for t in tables)  # suffix drafts up to 32
    verify = tuple(step * (1 + slope * n) for n in range(longest + 1))
    # a ratio, or ratios per draft length (a chain drafter's time grows with k)
    per_length = {n: d if isinstance(d, tuple) else (d,) for n, d in drafts.items()}
    table = CostTable(
        (measured.contexts[0],),
        (verify,),
        {n: tuple(step * r for r in d) for n, d in per_length.items()},
    )
    out = {}
    for name, pipe in pipes.items():
        if pipe.costs is None:
            out[name] = pipe
            continue
        out[name] = pipe.with_spec(pipe.spec, costs=table)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="builtin")
    parser.add_argument("--turns", default="first", help="first, or all (conversations)")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default="dflash,dspark,stacked")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="h200-qwen3-8b")
    parser.add_argument("--slope", type=float, help="verify cost per draft (override)")
    parser.add_argument("--dflash", type=float, help="DFlash draft / AR step (override)")
    parser.add_argument("--dspark", type=float, help="DSpark draft / AR step (override)")
    args = parser.parse_args()
    slope, dflash, dspark = PRESETS[args.preset]
    slope = slope if args.slope is None else args.slope
    drafts = {
        "dflash": dflash if args.dflash is None else args.dflash,
        "dspark": dspark if args.dspark is None else args.dspark,
        "ngram": COPY,
        "suffix": COPY,
    }

    from specgen.bench.harness import run_bench
    from specgen.bench.report import summarize
    from specgen.bench.suites import load_suite
    from specgen.cli.bench import _pipelines
    from specgen.cli.common import quiet_libraries
    from specgen.cli.options import Run
    from specgen.core.config import SamplingParams
    from specgen.terminal import display

    quiet_libraries()
    prompts = load_suite(args.suite, args.num_prompts, args.turns)
    names = ",".join(["ar", *args.methods.split(",")])
    pipes = _pipelines(Run(device="cpu", dtype="float32", quiet=True), names, [])
    pipes = priced_pipelines(pipes, slope, drafts)
    result = run_bench(
        pipes, prompts, max_new_tokens=args.max_new_tokens, sampling=SamplingParams()
    )
    meta = {
        "what_if": {"slope": slope, "draft_over_ar": drafts, "preset": args.preset},
        "model": "smollm2-135m",
        "suite": args.suite,
        "turns": args.turns,
        "num_prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
    }
    display.write_json(summarize(result, meta))


if __name__ == "__main__":
    main()
