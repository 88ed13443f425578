"""The overlap engine against the plain loop, side by side on the same prompts.

    python benchmarks/overlap_vs_sync.py [--method ngram] [--num-prompts 8] [--live]

Both engines run every prompt (order alternating); the caller's work per step is either
nothing but collecting tokens, or (`--live`) rendering the live view into a terminal-like
buffer, which is the host work the overlap engine hides. Prints tokens/s of each, their
ratio, whether the tokens matched, and a JSON line. On the CPU the overlap engine's thread
runs torch beside this thread's OpenMP team, which is why `--engine auto` is sync there.
"""

from __future__ import annotations

import argparse
import io
import json


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", default="ngram")
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--live", action="store_true", help="render the live view per step")
    args = parser.parse_args()

    from rich.console import Console

    from specgen.api.pipeline import Pipeline
    from specgen.bench.suites import BUILTIN, load_suite
    from specgen.cli.common import quiet_libraries
    from specgen.core.config import SpecConfig
    from specgen.terminal.live import LiveAnswer

    quiet_libraries()
    base = Pipeline.load(args.model, spec=SpecConfig(engine="sync"))
    pipes = {
        engine: base.with_spec(SpecConfig(method=args.method, engine=engine))
        for engine in ("sync", "overlap")
    }
    prompts = [p.text for p in load_suite(BUILTIN, args.num_prompts)]
    for pipe in pipes.values():
        pipe.generate("Hello", max_new_tokens=8, session=pipe.new_session())  # warm-up
    totals = {e: [0, 0.0] for e in pipes}
    same = 0
    for i, prompt in enumerate(prompts):
        tokens = {}
        for engine in list(pipes) if i % 2 == 0 else list(pipes)[::-1]:
            pipe = pipes[engine]
            view = None
            if args.live:
                console = Console(file=io.StringIO(), force_terminal=True, width=100)
                view = LiveAnswer(console, pipe.costs, show_drafts=True)
            stats, ids = None, []
            for chunk in pipe.stream(prompt, max_new_tokens=args.max_new_tokens,
                                     session=pipe.new_session()):  # fmt: skip
                stats = chunk.stats
                ids.extend(chunk.token_ids)
                if view is not None:
                    view.push(chunk)
            if view is not None:
                view.close(stats)
            totals[engine][0] += stats.new_tokens
            totals[engine][1] += stats.seconds
            tokens[engine] = ids
        same += tokens["sync"] == tokens["overlap"]
    rates = {e: n / s for e, (n, s) in totals.items()}
    print(f"sync:    {rates['sync']:.2f} tok/s")
    print(f"overlap: {rates['overlap']:.2f} tok/s")
    print(f"ratio overlap/sync: {rates['overlap'] / rates['sync']:.3f}; "
          f"identical answers {same}/{len(prompts)}")  # fmt: skip
    record = {"method": args.method, "live": args.live}
    print(json.dumps({**record, "identical": same, **rates}))


if __name__ == "__main__":
    main()
