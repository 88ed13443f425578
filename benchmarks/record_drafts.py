"""Record what each stacked drafter would propose at every position of AR's greedy answers
(benchmarks/replay.py), for benchmarks/replay_schedulers.py to judge schedulers on.

Each JSON line: the prompt's index, category, and `record`'s fields. The first line (index
-1) is the bench's warm-up answer ("Hello", 8 tokens), whose scheduler the first prompt's
learns from in a bench. About 10 s per 128-token answer on the 2-core CPU.

    python benchmarks/record_drafts.py --suite benchmarks/prompts/spec_bench.jsonl \\
        --num-prompts 52 --out drafts.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="builtin")
    parser.add_argument("--num-prompts", type=int, default=None)
    parser.add_argument(
        "--exclude-first",
        type=int,
        default=0,
        help="leave out the prompts --num-prompts N would take (a held-out set)",
    )
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True, help="JSON lines, appended to")
    parser.add_argument("--drafter", action="append", default=[],
                        help="drafters to stack (default: the registry's)")  # fmt: skip
    args = parser.parse_args()

    from replay import record

    from specgen.bench.suites import load_suite
    from specgen.cli.bench import _pipelines
    from specgen.cli.common import quiet_libraries
    from specgen.cli.options import Run

    quiet_libraries()
    prompts = load_suite(args.suite, args.num_prompts)
    if args.exclude_first:
        taken = {p.text for p in load_suite(args.suite, args.exclude_first)}
        prompts = [p for p in prompts if p.text not in taken]
    pipe = _pipelines(
        Run(device="cpu", dtype="float32", verify_policy="full", quiet=True), "stacked",
        args.drafter,
    )  # fmt: skip
    stacked = pipe["stacked"]
    jobs = [(-1, "warm-up", stacked.encode("Hello"), 8)]
    jobs += [(i, p.category, stacked.encode(p.text), args.max_new_tokens)
             for i, p in enumerate(prompts)]  # fmt: skip
    with open(args.out, "a", encoding="utf-8") as out:
        for index, category, ids, limit in jobs:
            # in the compute thread: `_pipelines` left this one at one torch thread
            traced = record(stacked, ids, limit)
            row = {"index": index, "category": category, **traced}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{index} {category} {len(row['tokens'])} tokens", file=sys.stderr)


if __name__ == "__main__":
    main()
