"""AR against ngram with and without the batch's draft guard (scheduling/guard.py), several
answers at once in one process, side by side, round after round.

    python benchmarks/batch_guard.py --parallel 4,8 --rounds 3

Each run answers the same requests (the 13 sample prompts twice, tagged per round so no
round reads another's cache) `--parallel` at a time through `Streams`, 256 tokens each
(EOS ignored, so every answer is the same work), and reports tokens per second over the
run, the steps, the draft rows verified and the shared steps the guard held back.
"ngram-unguarded" lets every shared step draft as its prices decide (the guard's
`drafting` always yes). Timings only; the order of the three turns each round.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from specgen.api.pipeline import Pipeline
from specgen.api.streams import Streams
from specgen.core.config import SpecConfig
from specgen.scheduling import guard as guard_module

SAMPLE = Path(__file__).resolve().parent / "prompts" / "spec_bench_sample.jsonl"
VARIANTS = ("ar", "ngram", "ngram-unguarded")


def run(pipe: Pipeline, parallel: int, prompts: list[str], tokens: int):
    """Tokens per second answering `prompts`, `parallel` at a time; the batch's counters."""
    streams = Streams(pipe, parallel=parallel)
    waiting = [pipe.encode(p) for p in prompts][::-1]
    done = 0
    start = time.perf_counter()
    while waiting or streams.active:
        while waiting and streams.free:
            streams.open(waiting.pop(), max_new_tokens=tokens, ignore_eos=True)
        for _, chunk in streams.step():
            if isinstance(chunk, Exception):
                raise chunk
            done += len(chunk.token_ids)
    return done / (time.perf_counter() - start), streams.counters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parallel", default="4,8")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=256)
    args = ap.parse_args()
    texts = [json.loads(line)["turns"][0] for line in SAMPLE.read_text().splitlines() if line]
    ar = Pipeline.load()
    pipes = {"ar": ar, "ngram": ar.with_spec(SpecConfig(method="ngram"))}
    for pipe in pipes.values():
        pipe.generate("Hello", max_new_tokens=8)
    guarded = guard_module.DraftGuard.drafting
    best: dict[tuple[int, str], float] = {}
    for r in range(args.rounds):
        prompts = [f"[{r}.{k}] {text}" for k in range(2) for text in texts]
        for n in (int(p) for p in args.parallel.split(",")):
            for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                free = variant.endswith("unguarded")
                guard_module.DraftGuard.drafting = (lambda _, __: True) if free else guarded
                rate, c = run(pipes[variant.split("-")[0]], n, prompts, args.tokens)
                best[(n, variant)] = max(best.get((n, variant), 0.0), rate)
                print(f"round {r} x{n} {variant}: {rate:.1f} tok/s (steps {c.steps}, draft "
                      f"rows {c.drafted}, held {c.held})", flush=True)  # fmt: skip
    guard_module.DraftGuard.drafting = guarded
    for n in (int(p) for p in args.parallel.split(",")):
        base = best[(n, "ar")]
        cells = [f"{v} {best[(n, v)]:.1f} ({best[(n, v)] / base:.3f}x)" for v in VARIANTS]
        print(f"x{n} fastest: " + ", ".join(cells))


if __name__ == "__main__":
    main()
