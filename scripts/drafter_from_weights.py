"""Write a drafter in its public format from bare training weights, and judge it.

For weights that left a training run without its final write: a run stopped at a limit
(its last `state.safetensors` checkpoint), or one on another machine whose state was too large to
bring back (scripts/gpu_train_drafters.sh's fallback sends `state["net"]` alone, in bf16).
The drafter it continues (`--like`) gives the shape, the draft vocabulary and the training
record; the held-out τ is measured here on the same split training used.

  python scripts/drafter_from_weights.py --weights dflash.net.safetensors \
      --like src/specgen/assets/drafters/smollm2-135m-dflash --out build/gpu-dflash \
      --record '{"steps": 1000, "device": "cuda"}'
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

import specgen.methods  # noqa: F401  (registers each method's training hooks)
from specgen.core.paths import specgen_home
from specgen.hub import resolve_model
from specgen.models.loading import load_target, read_config
from specgen.training.kind import training_of
from specgen.training.loop import TrainConfig, load_sequences, prepare_all, split_holdout
from specgen.training.trainer import Vocab


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--weights", type=Path, required=True, help="the net's state_dict")
    ap.add_argument("--like", type=Path, required=True, help="a drafter of the same shape")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=Path("data/smollm2-135m/answers.jsonl"))
    ap.add_argument("--record", default="{}", help="JSON merged into the training record")
    args = ap.parse_args()

    before = json.loads((args.like / "training.json").read_text())
    fields = set(TrainConfig.__dataclass_fields__)
    kept = {k: v for k, v in before["config"].items() if k in fields}
    cfg = TrainConfig(**{**kept, "target_layers": tuple(kept.get("target_layers", ()))})
    resolved = resolve_model("smollm2-135m")
    target = load_target(resolved.path, dtype=torch.float32, device="cpu", name=resolved.name)
    hooks = training_of(cfg.kind)
    target_config = read_config(resolved.path, resolved.name)
    config = hooks.config(target_config, target.args.num_layers, cfg, None)
    net = hooks.new(target, config, cfg, None)
    weights = {k: v.float() for k, v in load_file(str(args.weights)).items()}
    net.load_state_dict(weights)  # strict: any other shape fails here

    train_seqs, held_seqs = split_holdout(load_sequences(args.data), cfg.holdout_every)
    held = prepare_all(target, hooks, net, held_seqs, resolved.name, specgen_home() / "features")
    vocab = Vocab.of(target, train_seqs)
    tau = hooks.evaluate(target, net, held, vocab).tau
    record = {**before, **json.loads(args.record), "offline_tau": round(tau, 4)}
    # the drafter, its training record, and the draft vocabulary training ranked
    hooks.write(args.out, net, config, vocab, {k: v for k, v in record.items() if k != "curve"})
    (args.out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"{args.out}: held-out τ {tau:.4f} (was {before['offline_tau']})")


if __name__ == "__main__":
    main()
