"""What one speculative step costs on this machine: target forwards over 1..k+1 tokens and
each drafter's time per step, for the default model and drafters of the shape specgen
would ship for it (random weights: timing does not depend on them).

    python benchmarks/step_costs.py [--model smollm2-135m] [--layers 1] [--context 128,1024]

Prints one table per context and a JSON line. The ratios are what decides whether a method
can win here: a step verifying l drafts pays t_draft + t_verify(1 + l) and commits
1 + sum of survival on average, against t_verify(1) per token for plain AR.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "tests" / "fixtures" / "dspark-qwen3-4b-block7.config.json"


def random_drafter(kind: str, target, layers: int, block: int):
    """A DFlash / DSpark method with random weights sized for `target`."""
    from specgen.methods.dflash.drafter import DFlashMethod
    from specgen.methods.dspark.drafter import DSparkMethod
    from specgen.methods.dspark.network import DSparkArgs, DSparkNet
    from specgen.models.drafters.dflash import DFlashArgs, DFlashNet

    a = target.args
    cfg = {
        "model_type": "qwen3",
        "hidden_size": a.hidden_size,
        "intermediate_size": a.intermediate_size,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab_size,
        "num_hidden_layers": layers,
        "rms_norm_eps": a.rms_norm_eps,
        "max_position_embeddings": a.max_positions,
        "rope_parameters": {"rope_theta": a.rope.theta, "rope_type": "default"},
        "block_size": block,
        "mask_token_id": 0,
        "target_layer_ids": [1, a.num_layers // 2, a.num_layers - 3],
        "num_target_layers": a.num_layers,
    }
    if kind == "dspark":
        cfg.update(
            num_anchors=512,
            markov_rank=256,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        )
        net = DSparkNet(DSparkArgs.from_hf(cfg, name=kind), dtype=target.dtype, device="cpu")
    else:
        net = DFlashNet(DFlashArgs.from_hf(cfg, name=kind), dtype=target.dtype, device="cpu")
    gen = torch.Generator().manual_seed(0)
    for p in net.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    cls = DSparkMethod if kind == "dspark" else DFlashMethod
    return cls(net, target, block, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--layers", type=int, default=1, help="drafter layers")
    parser.add_argument("--context", default="128,1024")
    args = parser.parse_args()

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.engine.costs import measure_costs, measure_draft_seconds
    from specgen.methods.ngram.drafter import NgramMethod

    quiet_libraries()
    pipe = Pipeline.load(args.model, dtype=args.dtype)
    contexts = tuple(int(c) for c in args.context.split(","))
    table = measure_costs(pipe.model, 8, contexts=contexts)
    drafters = {
        "dflash (block 8)": random_drafter("dflash", pipe.model, args.layers, 8),
        "dspark (block 7)": random_drafter("dspark", pipe.model, args.layers, 7),
        "ngram": NgramMethod(10, pipe.model.device),
    }
    draft = {
        name: {c: measure_draft_seconds(m, pipe.model, context=c)[-1] for c in contexts}
        for name, m in drafters.items()
    }
    threads = torch.get_num_threads()
    result = {"model": pipe.name, "dtype": str(pipe.model.dtype), "threads": threads}
    for c, row in zip(table.contexts, table.seconds, strict=True):
        ar = row[0]
        print(f"\ncontext {c}: AR step {ar * 1e3:.1f} ms")
        print("  verify l drafts (1+l tokens) / AR step: " + "  ".join(
            f"l={n}: {s / ar:.2f}" for n, s in enumerate(row)))  # fmt: skip
        for name, per in draft.items():
            print(f"  {name} draft step / AR step: {per[c] / ar:.2f} ({per[c] * 1e3:.1f} ms)")
        result[str(c)] = {
            "ar_ms": ar * 1e3,
            "verify_over_ar": [s / ar for s in row],
            "draft_over_ar": {name: per[c] / ar for name, per in draft.items()},
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
