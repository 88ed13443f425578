"""Does the live view slow generation? The same answers with and without it, interleaved.

    python benchmarks/live_view_overhead.py [--method ngram] [--num-prompts 6]

"without": chunks are consumed and nothing is drawn. "with": `LiveAnswer` draws into a
terminal-like console (an in-memory buffer with colours and cursor moves, refreshed by
Rich's thread 4 times a second as on a real terminal). Prints tokens/s of both and their
ratio, then one JSON line.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--method", default="ngram")
    parser.add_argument("--num-prompts", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()

    from rich.console import Console

    from specgen.api.pipeline import Pipeline
    from specgen.bench.suites import BUILTIN, load_suite
    from specgen.cli.common import quiet_libraries
    from specgen.core.config import SpecConfig
    from specgen.terminal.live import LiveAnswer

    quiet_libraries()
    pipe = Pipeline.load(args.model, spec=SpecConfig(method=args.method))
    prompts = [p.text for p in load_suite(BUILTIN, args.num_prompts)]
    pipe.generate("Hello", max_new_tokens=8)  # warm-up
    totals = {"without": [0, 0.0], "with": [0, 0.0]}
    for i, prompt in enumerate(prompts):
        for mode in ("without", "with") if i % 2 == 0 else ("with", "without"):
            view = None
            if mode == "with":
                console = Console(file=io.StringIO(), force_terminal=True, width=100)
                view = LiveAnswer(console, pipe.costs, show_drafts=True)
            stats = None
            chunks = pipe.stream(
                prompt, max_new_tokens=args.max_new_tokens, session=pipe.new_session()
            )
            for chunk in chunks:
                stats = chunk.stats
                if view is not None:
                    view.push(chunk)
            if view is not None:
                view.close(stats)
            totals[mode][0] += stats.new_tokens
            totals[mode][1] += stats.seconds
    rates = {m: n / s for m, (n, s) in totals.items()}
    print(f"without live view: {rates['without']:.2f} tok/s")
    print(f"with live view:    {rates['with']:.2f} tok/s")
    print(f"ratio with/without: {rates['with'] / rates['without']:.3f}")
    print(json.dumps({"method": args.method, "prompts": len(prompts), **rates}))


if __name__ == "__main__":
    main()
