"""What a DFlash drafter of the default model costs per draft, by depth and draft
vocabulary, against the target's own step, side by side in one run (fastest of N): the
prices that choose the long run's drafter shape (scripts/long_train.sh).

    python benchmarks/drafter_shapes.py [--repeats 5]

Shapes: the shipped drafter (1 layer, its draft vocabulary: every token its training
answers use) with its vocabulary cut to the N most frequent answer tokens, and random
drafters of 2 and 3 layers (timing does not depend on the weights). Coverage: the share of
held-out answer tokens (every 65th answer) inside each vocabulary, the most a draft from it
can be right. Draft costs are per draft step for the longest draft (7 tokens) and one
token, as the scheduler prices them (engine/costs.measure_draft_seconds).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the random drafter builder (tests/support)

SHIPPED = ROOT / "src/specgen/assets/drafters/smollm2-135m-dflash"
ANSWERS = ROOT / "data/smollm2-135m/answers.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab", default="4096,8192,12000")
    args = parser.parse_args()

    from specgen.api.pipeline import Pipeline
    from specgen.api.spec import load_method
    from specgen.core.config import SpecConfig
    from specgen.drafting.vocab import save_draft_vocab
    from specgen.engine.costs import measure_costs, measure_draft_seconds
    from specgen.training.loop import TrainConfig, load_sequences, split_holdout
    from support.drafters import save_tiny_dflash

    ar = Pipeline.load("smollm2-135m")
    sequences = load_sequences(ANSWERS)
    train, held = split_holdout(sequences, TrainConfig.holdout_every)
    counts = Counter(t for s in train for t in s.ids[s.response_start :])
    held_tokens = [t for s in held for t in s.ids[s.response_start :]]
    shipped_vocab = json.loads((SHIPPED / "draft_vocab.json").read_text())["token_ids"]
    tmp = Path(tempfile.mkdtemp())
    shapes: dict[str, tuple[Path, list[int] | None]] = {
        f"1 layer, {len(shipped_vocab)} rows (shipped)": (SHIPPED, None)
    }
    for n in (int(x) for x in args.vocab.split(",")):
        top = sorted(t for t, _ in counts.most_common(n))
        path = tmp / f"v{n}"
        shutil.copytree(SHIPPED, path)
        save_draft_vocab(path, top)
        shapes[f"1 layer, {n} rows"] = (path, top)
    for layers in (2, 3):
        path = save_tiny_dflash(tmp / f"l{layers}", hidden=576, heads=9, kv_heads=3,
                                head_dim=64, vocab=49152, layers=layers, block_size=8,
                                mask_token_id=0, num_target_layers=30,
                                target_layer_ids=[1, 7, 14, 21, 27], scale=0.05)  # fmt: skip
        save_draft_vocab(path, shipped_vocab)
        shapes[f"{layers} layers, {len(shipped_vocab)} rows"] = (path, None)
    step = measure_costs(ar.model, 1, contexts=(128,), repeats=args.repeats).seconds[0]
    print(f"AR step {step[0] * 1e3:.2f} ms; verify 1 draft {step[1] / step[0]:.2f}x a step")
    print(f"{'drafter':<34} {'draft 7':>9} {'draft 1':>9} {'x step':>7} {'coverage':>9}")
    for name, (path, vocab) in shapes.items():
        spec = SpecConfig(method="dflash", drafter=str(path))
        method = load_method(ar.model, spec, ar.name)
        seconds = measure_draft_seconds(method, ar.model, repeats=args.repeats)
        rows = set(vocab if vocab is not None else shipped_vocab)
        covered = sum(t in rows for t in held_tokens) / max(len(held_tokens), 1)
        print(f"{name:<34} {seconds[-1] * 1e3:>7.2f}ms {seconds[0] * 1e3:>7.2f}ms "
              f"{seconds[-1] / step[0]:>6.2f}x {covered:>8.1%}")  # fmt: skip


if __name__ == "__main__":
    main()
