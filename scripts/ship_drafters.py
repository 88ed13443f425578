"""Whether the long run's drafters (scripts/long_train.sh) beat the shipped ones, and with
--ship, copying those that do into src/specgen/assets/drafters/ (their layout kept).

Judged as the drafters are used, not offline: the default's own packed GGUF decodes the
held-out prompts (every 65th answer of the training data, `split_holdout`, which training
never sees) with each drafter, every draft verified whole, greedy, 128 new tokens; τ
counts the bonus. Both drafters answer the same prompts with the same tokens (lossless),
so their τ compare exactly. A candidate ships only when its τ is at least MARGIN (0.1)
above the shipped drafter's, so git grows only with real improvements. A DSpark candidate
is calibrated (`specgen calibrate` on the held-back calibration prompts) before it ships.

    python scripts/ship_drafters.py --root build/long-train --kinds dflash dspark \
        --data data/smollm2-135m/answers.jsonl [--data MORE.jsonl] [--ship]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

MARGIN = 0.1
FILES = ("config.json", "model.safetensors", "training.json", "draft_vocab.json",
         "calibration.json")  # fmt: skip
ASSETS = Path("src/specgen/assets/drafters")


def held_out_prompts(data: list[Path], limit: int) -> list[list[int]]:
    from specgen.training.loop import TrainConfig, load_sequences, split_holdout

    sequences = [s for path in data for s in load_sequences(path)]
    _, held = split_holdout(sequences, TrainConfig.holdout_every)
    return [s.ids[: s.response_start] for s in held[:limit]]


def tau(pipe, prompts: list[list[int]], tokens: int) -> tuple[float, list[list[int]]]:
    """(τ over all prompts, the answers): every draft verified, greedy."""
    steps = accepted = 0
    answers = []
    for ids in prompts:
        out = []
        for chunk in pipe.stream_ids(ids, max_new_tokens=tokens, session=pipe.new_session(),
                                     remember=False):  # fmt: skip
            out.extend(chunk.token_ids)
            stats = chunk.stats
        steps, accepted = steps + stats.steps, accepted + stats.accepted
        answers.append(out)
    return (accepted + steps) / max(steps, 1), answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("build/long-train"))
    parser.add_argument("--kinds", nargs="+", default=["dflash", "dspark", "eagle3"])
    parser.add_argument("--data", type=Path, action="append", required=True)
    parser.add_argument("--prompts", type=int, default=60, help="held-out prompts measured")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ship", action="store_true", help="copy the drafters that earn it")
    args = parser.parse_args()

    from specgen.api.pipeline import Pipeline
    from specgen.core.config import SpecConfig

    prompts = held_out_prompts(args.data, args.prompts)
    ar = Pipeline.load("smollm2-135m")
    report = {}
    for kind in args.kinds:
        candidate, shipped = args.root / kind, ASSETS / f"smollm2-135m-{kind}"
        if not (candidate / "model.safetensors").is_file():
            print(f"{kind}: no candidate in {candidate} yet")
            continue
        measured = {}
        for label, path in (("shipped", shipped), ("candidate", candidate)):
            spec = SpecConfig(method=kind, drafter=str(path.resolve()), verify_policy="full")
            measured[label] = tau(ar.with_spec(spec), prompts, args.tokens)
        (old, a), (new, b) = measured["shipped"], measured["candidate"]
        assert a == b, f"{kind}: the two drafters' answers differ (a bug: decoding is lossless)"
        earns = new >= old + MARGIN
        report[kind] = {"shipped_tau": round(old, 4), "candidate_tau": round(new, 4),
                        "prompts": len(prompts), "ships": earns and args.ship}  # fmt: skip
        verdict = "ships" if earns else f"stays (needs >= {old + MARGIN:.3f})"
        print(f"{kind}: held-out τ {old:.3f} shipped, {new:.3f} candidate -> {verdict}")
        if earns and args.ship:
            if kind == "dspark":
                subprocess.run([sys.executable, "-m", "specgen", "calibrate", "--prompts",
                                "data/smollm2-135m/calibration-prompts.jsonl", "--drafter",
                                str(candidate), "--quiet"], check=True)  # fmt: skip
            for name in FILES:
                if (candidate / name).is_file():
                    shutil.copy2(candidate / name, shipped / name)
    (args.root / "ship.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
