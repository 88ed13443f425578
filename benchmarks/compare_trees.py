"""Two source trees of specgen side by side in one run: did a change move a benchmark?

    python benchmarks/compare_trees.py --trees ../base ../main --methods ar,dflash

One worker process per tree (its `src/` first on the path) loads the embedded default once
per method; the prompts then go to the trees in turn, alternating which tree answers
first, so both see the same machine load. Reported per method: each tree's decode
tokens/s (median over prompts), the ratio new/base, and how many answers were
token-identical across the trees, and the same with the prompt's reading counted. The
last line is one JSON object. `--suite` takes another prompt file (jsonl with "turns").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SAMPLE = HERE / "prompts" / "spec_bench_sample.jsonl"

WORKER = r"""
import json, sys
from specgen import Pipeline, SpecConfig
pipes = {}
for line in sys.stdin:
    req = json.loads(line)
    m = req["method"]
    if m not in pipes:
        base = next(iter(pipes.values()), None)
        spec = SpecConfig(method=m)
        pipes[m] = Pipeline.load(spec=spec) if base is None else base.with_spec(spec)
    pipe = pipes[m]
    tokens, stats = [], None
    for chunk in pipe.stream(req["prompt"], max_new_tokens=req["max_new"],
                             session=pipe.new_session()):
        tokens.extend(chunk.token_ids)
        stats = chunk.stats
    decode = stats.seconds - (stats.ttft_seconds or 0.0)
    print(json.dumps({"tokens": tokens, "decode_tps": (stats.new_tokens - 1) / decode,
                      "tps": stats.new_tokens / stats.seconds}),
          flush=True)
"""


class Worker:
    def __init__(self, tree: Path, threads: int | None) -> None:
        env = {**os.environ, "PYTHONPATH": str(tree / "src")}
        cmd = [sys.executable, "-c", WORKER]
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def ask(self, method: str, prompt: str, max_new: int) -> dict:
        self.proc.stdin.write(json.dumps({"method": method, "prompt": prompt,
                                          "max_new": max_new}) + "\n")  # fmt: skip
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit("a worker died (see its error above)")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs=2, type=Path, required=True, metavar=("BASE", "NEW"))
    ap.add_argument("--methods", default="ar,dflash")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--suite", type=Path, default=SAMPLE, help="prompts (jsonl with turns)")
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.suite.read_text().splitlines() if line.strip()]
    prompts = [r["turns"][0] for r in rows][: args.prompts]
    workers = [Worker(t.resolve(), args.threads) for t in args.trees]
    methods = args.methods.split(",")
    report = {}
    try:
        for method in methods:
            for w in workers:  # load and warm up outside the timed prompts
                w.ask(method, "Hello", 4)
            tps: list[list[float]] = [[], []]
            whole: list[list[float]] = [[], []]  # with the prompt's reading
            same = 0
            for i, prompt in enumerate(prompts):
                order = (0, 1) if i % 2 == 0 else (1, 0)
                answers = {}
                for j in order:
                    answers[j] = workers[j].ask(method, prompt, args.max_new_tokens)
                    tps[j].append(answers[j]["decode_tps"])
                    whole[j].append(answers[j]["tps"])
                same += answers[0]["tokens"] == answers[1]["tokens"]
            base, new = statistics.median(tps[0]), statistics.median(tps[1])
            wb, wn = statistics.median(whole[0]), statistics.median(whole[1])
            report[method] = {
                "base_tps": round(base, 2), "new_tps": round(new, 2),
                "new_over_base": round(new / base, 3), "identical": f"{same}/{len(prompts)}",
                "base_whole_tps": round(wb, 2), "new_whole_tps": round(wn, 2),
            }  # fmt: skip
            print(f"{method:8} base {base:7.2f} tok/s  new {new:7.2f} tok/s  "
                  f"new/base {new / base:.3f}  identical {same}/{len(prompts)}  "
                  f"(with prompt: {wb:.2f} -> {wn:.2f}, {wn / wb:.3f})")  # fmt: skip
    finally:
        for w in workers:
            w.close()
    print(json.dumps({"trees": [str(t) for t in args.trees], "methods": report}))


if __name__ == "__main__":
    main()
