"""Step costs at real model shapes with random weights (no Hub needed): the GPU check.

    python benchmarks/shapes_bench.py --target tests/fixtures/qwen3-8b.config.json \
        --device cuda --dtype bfloat16 [--contexts 512,4096] [--out results.json]

Builds the target from a real config.json with random weights, plus a DFlash drafter
(5 layers, block 16, z-lab's layout) and a DSpark drafter (5 layers, block 7, Markov rank
256, DeepSpec's layout) sized for it, and measures:
- the AR step (one token) and verify steps over 1..16 tokens at each context;
- AR memory-bandwidth utilisation (bytes a step must read / step time / peak bandwidth);
- each drafter's time per step (propose + observe);
- the AR and verify steps again through `GraphedForward` (CUDA graphs on CUDA);
- projected tokens/s = published τ / (draft + verify step time), labelled as projected:
  τ from the DSpark paper's Table 1 (Qwen3-4B/8B, γ = 7, T = 1; DFlash there is the
  paper's block-7 baseline; see research/dspark.md §5.1), which is a per-step figure
  measured elsewhere, not here.
Timing only: the weights are random, so nothing here says anything about acceptance.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parent / "tests" / "fixtures"  # copies of ../shared/fixtures: they travel

# DSpark paper Table 1 (T=1, γ=7): τ on GSM8K / MT-Bench, incl. the bonus token.
PUBLISHED_TAU = {
    "qwen3-4b": {"dflash": (5.40, 3.07), "dspark": (6.11, 3.64)},
    "qwen3-8b": {"dflash": (5.33, 3.11), "dspark": (6.17, 3.72)},
}


# the target text fields DeepSpec's build_draft_config copies into a Gemma 4 draft config
GEMMA_COPIED = (
    "attention_k_eq_v", "final_logit_softcapping", "global_head_dim", "head_dim",
    "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
    "num_global_key_value_heads", "rms_norm_eps", "rope_parameters", "sliding_window",
    "vocab_size",
)  # fmt: skip


def _gemma_dspark_config(target: dict) -> dict:
    """DeepSpec's Gemma 4 draft config (the published 12B one) resized to this target."""
    text = target["text_config"]
    cfg = json.loads((FIXTURES / "dspark-gemma4-12b-block7.config.json").read_text())
    cfg.update({k: text[k] for k in GEMMA_COPIED if k in text})
    n = text["num_hidden_layers"]
    if n != cfg["num_target_layers"]:
        cfg["target_layer_ids"] = [1, *(1 + i * (n - 4) // 4 for i in (1, 2, 3)), n - 3]
    cfg.update(num_target_layers=n, mask_token_id=text["vocab_size"] - 1)
    return cfg


def _drafter_config(target: dict, kind: str) -> dict:
    """A draft config in the published layout for this target (DeepSpec's build_draft_config
    for DSpark; z-lab's fields for DFlash)."""
    from specgen.training.checkpoint import text_config

    if kind == "dspark" and str(target.get("model_type", "")).startswith("gemma4"):
        return _gemma_dspark_config(target)
    target = text_config(target)  # a hybrid target's text fields, as a drafter reads them
    n = target["num_hidden_layers"]
    cfg = {**target, "num_hidden_layers": 5, "layer_types": ["full_attention"] * 5}
    cfg["target_layer_ids"] = [1, *(1 + i * (n - 4) // 4 for i in (1, 2, 3)), n - 3]
    cfg["num_target_layers"] = n
    cfg["mask_token_id"] = target["vocab_size"] - 1
    if kind == "dspark":
        cfg.update(
            architectures=["Qwen3DSparkModel"],
            block_size=7,
            num_anchors=512,
            markov_rank=256,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        )
    else:
        # z-lab's layout: Qwen3 layers, whatever the target (a Gemma target's scalars kept)
        cfg.update(architectures=["DFlashDraftModel"], block_size=16, model_type="qwen3")
    return cfg


def _randomize(module: torch.nn.Module) -> None:
    # drawn where the weights live: an 8B model's worth of CPU randn would take minutes
    gens: dict[torch.device, torch.Generator] = {}
    for p in module.parameters():
        gen = gens.setdefault(p.device, torch.Generator(device=p.device).manual_seed(0))
        p.data.copy_(torch.randn(p.shape, generator=gen, device=p.device) * 0.02)


def build(target_cfg: dict, device: str, dtype: torch.dtype, quantize: str | None = None):
    from specgen.methods.dflash.drafter import DFlashMethod
    from specgen.methods.dspark.drafter import DSparkMethod
    from specgen.methods.dspark.network import DSparkArgs, DSparkNet
    from specgen.models.drafters.dflash import DFlashArgs, DFlashNet
    from specgen.models.families import model_args
    from specgen.models.transformer import Transformer

    target = Transformer(model_args(target_cfg), dtype=dtype, device=device)
    _randomize(target)
    if quantize:  # the target's matrices packed (issue 33's GPU targets: int4 vs bf16)
        import specgen.models.formats.packed_weight  # noqa: F401  (registers int4/int8)
        from specgen.models.formats.weights import convert_weights

        convert_weights(target, quantize)
    dflash = DFlashNet(
        DFlashArgs.from_hf(_drafter_config(target_cfg, "dflash"), name="dflash"),
        dtype=dtype,
        device=torch.device(device),
    )
    dspark = DSparkNet(
        DSparkArgs.from_hf(_drafter_config(target_cfg, "dspark"), name="dspark"),
        dtype=dtype,
        device=torch.device(device),
    )
    _randomize(dflash)
    _randomize(dspark)
    methods = {"dflash": DFlashMethod(dflash.eval(), target, 16, None)}
    if target.args.hybrid is None:  # DSpark drafters exist for the attention families only
        methods["dspark"] = DSparkMethod(dspark.eval(), target, 7, None)
    return target.eval(), methods


def graphed_seconds(target, context: int, sizes=(1, 8, 16), repeats: int = 20) -> dict:
    """Step time over T tokens through `GraphedForward`: replayed CUDA graphs on CUDA (the
    eager static path elsewhere), after a prefill of `context` random tokens."""
    from specgen.models.graphs import GraphedForward

    cache = target.new_cache(context + 2 * max(sizes) + 1, steps=max(sizes))
    forward = GraphedForward(
        target, cache, max_tokens=max(sizes), capture=target.device.type == "cuda"
    )
    ids = torch.randint(0, target.args.vocab_size, (1, context), device=target.device)
    target(ids, cache, num_logits=1)
    times = {}
    for t in sizes:
        block = ids[:, :t]
        for _ in range(3):  # the first call captures
            forward(block, cache)
            cache.rollback(context)
        _sync(target.device)
        start = time.perf_counter()
        for _ in range(repeats):
            forward(block, cache)
            cache.rollback(context)
        _sync(target.device)
        times[t] = (time.perf_counter() - start) / repeats
    if target.args.hybrid is not None:  # a verify after one that kept half its tokens:
        t = max(sizes)  # the Gated DeltaNet layers first replay those 8 (the rollback)
        block = ids[:, :t]
        _sync(target.device)
        start = time.perf_counter()
        for _ in range(repeats):
            forward(block, cache)
            cache.rollback(context + t // 2)
            forward(block, cache)
            cache.rollback(context)
        _sync(target.device)
        times["after_partial"] = (time.perf_counter() - start) / repeats - times[t]
    return times


def loop_parser(doc: str) -> argparse.ArgumentParser:
    """The options of the benchmarks that run one target's decoding loop at real shapes."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--target", type=Path, default=FIXTURES / "qwen3-8b.config.json")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--out", type=Path)
    return parser


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, action="append", default=[])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--contexts", default="512,4096")
    parser.add_argument("--quantize", choices=("int8", "int4"), help="pack the target's matrices")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    from specgen.bench.roofline import model_bytes_per_step, peak_bandwidth, utilisation
    from specgen.engine.costs import measure_costs, measure_draft_seconds

    dtype = getattr(torch, args.dtype)
    contexts = tuple(int(c) for c in args.contexts.split(","))
    targets = args.target or [FIXTURES / "qwen3-4b.config.json", FIXTURES / "qwen3-8b.config.json"]
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    peak = peak_bandwidth(device_name)
    report = {"device": device_name, "dtype": args.dtype, "torch": torch.__version__, "models": {}}
    for path in targets:
        name = path.name.removesuffix(".config.json")
        cfg = json.loads(path.read_text())
        started = time.perf_counter()
        target, methods = build(cfg, args.device, dtype, args.quantize)
        table = measure_costs(target, 16, contexts=contexts, repeats=5)
        row: dict = {"contexts": {}}
        for c, seconds in zip(table.contexts, table.seconds, strict=True):
            ar = seconds[0]
            util = None
            if peak:
                util = utilisation(model_bytes_per_step(target, c), ar, peak)
            drafts = {
                k: measure_draft_seconds(m, target, context=c)[-1] for k, m in methods.items()
            }  # each drafter's longest draft
            graphed = graphed_seconds(target, c)
            projected = {}
            for kind, tau in PUBLISHED_TAU.get(name, {}).items():
                drafted = 15 if kind == "dflash" else 7  # block 16 (slot 0 = anchor) / γ 7
                step = drafts[kind] + seconds[drafted]
                projected[kind] = {"gsm8k": tau[0] / step, "mt_bench": tau[1] / step}
            row["contexts"][str(c)] = {
                "ar_step_ms": ar * 1e3,
                "ar_tokens_per_second": 1 / ar,
                "ar_bandwidth_utilisation": util,
                "verify_ms": [s * 1e3 for s in seconds],  # [n]: 1 + n tokens
                "verify16_over_ar": seconds[15] / ar,
                "draft_ms": {k: v * 1e3 for k, v in drafts.items()},
                "draft_over_ar": {k: v / ar for k, v in drafts.items()},
                "projected_tokens_per_second": projected,
                # eager: verify_ms above; graphed: the same steps replayed as CUDA graphs
                "graphed_step_ms": {str(t): v * 1e3 for t, v in graphed.items()},
                "graphed_ar_tokens_per_second": 1 / graphed[1],
                "graphed_verify16_over_ar": graphed[16] / graphed[1],
                # hybrid targets: a verify-16 step replaying 8 committed tokens of the one
                # before (the rollback), over an AR step
                "graphed_rollback_verify16_over_ar": (
                    graphed["after_partial"] / graphed[1] if "after_partial" in graphed else None
                ),
            }
            util_text = f"{util:.0%}" if util is not None else "n/a"
            print(
                f"{name} ctx {c}: AR {ar * 1e3:.2f} ms ({1 / ar:.0f} tok/s, {util_text} of "
                f"roofline) · verify16/AR {seconds[15] / ar:.2f} · graphed AR "
                f"{graphed[1] * 1e3:.2f} ms, verify16/AR {graphed[16] / graphed[1]:.2f} · "
                + (
                    f"after a partial acceptance {graphed['after_partial'] / graphed[1]:.2f} · "
                    if "after_partial" in graphed
                    else ""
                )  # fmt: skip
                + " · ".join(f"{k} draft/AR {v / ar:.2f}" for k, v in drafts.items())
                + " · projected "
                + ", ".join(
                    f"{k} {p['gsm8k']:.0f}/{p['mt_bench']:.0f} tok/s" for k, p in projected.items()
                )  # fmt: skip
            )
        row["build_and_measure_seconds"] = time.perf_counter() - started
        report["models"][name] = row
        del target, methods
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    text = json.dumps(report, indent=1)
    if args.out:
        args.out.write_text(text)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
