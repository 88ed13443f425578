"""Which training levers pay on this machine: equal-time DFlash runs, offline τ on held-out answers.

    python benchmarks/train_levers.py --data data/smollm2-135m/answers.jsonl --minutes 4 \
        [--only baseline,vocab,...] [--out benchmarks/results/cpu-train-levers.json]

Every run trains a fresh drafter for the same wall-clock minutes on the same answers (one
process, one loaded target, the target's features computed once and shared), then measures
the offline τ on the same held-out answers (`training/evaluate.py`, the decoding walk).
Each lever is added to the one before it when it helped in the CPU study's direction, so
the table reads as a path from the study's recipe to ours:

    baseline  the study's recipe: random init, full LM head, 1 layer, taps 1/14/27
    vocab     + the head restricted to the data's tokens (a speed lever: more steps)
    init      + drafter layers copied from the target (the layer after the top tap)
    layers2   + a second drafter layer
    taps5     init + five taps (1/7/14/21/27)
    less-data init on the first 544 training answers only (what more data buys)
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

LEVERS = {
    "baseline": dict(init_from_target=False, restrict_vocab=False),
    "vocab": dict(init_from_target=False, restrict_vocab=True),
    "init": dict(init_from_target=True, restrict_vocab=True),
    "layers2": dict(init_from_target=True, restrict_vocab=True, draft_layers=2),
    "taps5": dict(init_from_target=True, restrict_vocab=True, target_layers=(1, 7, 14, 21, 27)),
    "less-data": dict(init_from_target=True, restrict_vocab=True, train_sequences=544),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--only", default=",".join(LEVERS))
    parser.add_argument(
        "--out", type=Path, default=Path("benchmarks/results/cpu-train-levers.json")
    )
    args = parser.parse_args()

    import specgen.methods  # noqa: F401  (registers each method's training hooks)
    from specgen.cli.common import quiet_libraries
    from specgen.core.paths import specgen_home
    from specgen.hub import resolve_model
    from specgen.models.loading import load_target, read_config
    from specgen.training.features import target_features
    from specgen.training.loop import TrainConfig, load_sequences, train

    quiet_libraries()
    resolved = resolve_model("smollm2-135m")
    target = load_target(resolved.path, dtype=torch.float32, device="cpu", name=resolved.name)
    config = read_config(resolved.path, resolved.name)
    data = load_sequences(args.data)
    base = TrainConfig(kind="dflash", block_size=8, minutes=args.minutes, eval_minutes=1e9)
    # every layer any run here (or the DSpark drafter: the last layer) needs, in one pass
    layers = (1, 7, 14, 21, 27, target.args.num_layers - 1)
    cache = specgen_home() / "features"

    def report(row: dict) -> None:
        print(f"features {row['prepared']}/{row['of']}", flush=True)

    target_features(target, resolved.name, data, layers, cache, report)
    results = json.loads(args.out.read_text()) if args.out.is_file() else {}
    for name in args.only.split(","):
        cfg = replace(base, **LEVERS[name])
        started = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            summary = train(target, config, data, cfg, Path(tmp), target_name=resolved.name,
                            features_cache=specgen_home() / "features")  # fmt: skip
        summary.pop("config")
        results[name] = {"lever": LEVERS[name], "minutes": args.minutes, **summary,
                         "wall_seconds": round(time.time() - started)}  # fmt: skip
        print(f"{name:10s} τ {summary['offline_tau']:.3f}  steps {summary['steps']:5d}  "
              f"train tokens {summary['tokens']}", flush=True)  # fmt: skip
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
