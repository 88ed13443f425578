"""Answers stepped together on the CPU: one fused pass for all their rows against each
answer's own pass (`SPECGEN_CPU_PASS=separate`), side by side in one run.

    python benchmarks/shared_pass.py --clients 1,2,4 --method ar --rounds 3

For each number of answers at once, `generate_many` answers that many prompts (Spec-Bench's
first ones, greedy, --tokens each) with every slot busy, shared and separate in turn each
round (so both see the same machine load); reported: aggregate tokens/s (fastest round),
the shared / separate ratio and each against one answer alone. Every answer is checked
identical across modes and against the same prompt answered alone.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from specgen import Pipeline
from specgen.api.streams import generate_many
from specgen.core.config import SpecConfig

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT.parent / "shared" / "data" / "spec_bench.jsonl"


def prompts(n: int) -> list[str]:
    if SUITE.is_file():
        rows = [json.loads(line) for line in SUITE.read_text().splitlines()[:n]]
        return [r["turns"][0] for r in rows]
    return [f"Tell me a story about the number {i}." for i in range(n)]


def run(pipe, asked: list[str], tokens: int, mode: str) -> tuple[float, list[list[int]]]:
    os.environ["SPECGEN_CPU_PASS"] = mode
    start = time.perf_counter()
    done = generate_many(pipe, asked, parallel=len(asked), max_new_tokens=tokens)
    seconds = time.perf_counter() - start
    return sum(len(c.token_ids) for c in done) / seconds, [c.token_ids for c in done]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--method", default="ar")
    ap.add_argument("--clients", default="1,2,4")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    pipe = Pipeline.load(a.model)
    if a.method != "ar":
        pipe = pipe.with_spec(SpecConfig(method=a.method))
    clients = [int(c) for c in a.clients.split(",")]
    asked = prompts(max(clients))
    alone = [run(pipe, [p], a.tokens, "fused")[1][0] for p in asked]  # also warms up
    best: dict[tuple[int, str], float] = {}
    for _ in range(a.rounds):
        for n in clients:
            for mode in ("fused", "separate"):
                rate, ids = run(pipe, asked[:n], a.tokens, mode)
                assert ids == alone[:n], f"{n} answers, {mode}: not the answers alone"
                best[n, mode] = max(best.get((n, mode), 0.0), rate)
    one = best[clients[0], "fused"]
    print(f"load average {os.getloadavg()[0]:.2f}; {a.method}, {a.tokens} tokens an answer")
    print("answers | shared tok/s | separate tok/s | shared/separate | shared vs one")
    for n in clients:
        s, p = best[n, "fused"], best[n, "separate"]
        print(f"{n:7d} | {s:12.1f} | {p:14.1f} | {s / p:15.2f}x | {s / one:12.2f}x")
    print(json.dumps({f"{n}:{m}": round(v, 2) for (n, m), v in best.items()}))


if __name__ == "__main__":
    main()
