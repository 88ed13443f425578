"""What exact rollback of a Gated DeltaNet layer's state costs, two ways, at real shapes.

    python benchmarks/hybrid_rollback.py [--device cpu|cuda] [--shape 9b] [--repeats 5]

A verify step runs the gated delta rule over [anchor, d1..dk] (T = k + 1 tokens) and must
leave the state after the anchor and the a accepted drafts. Two mechanisms:
- tape replay (what specgen does, models/cache/hybrid.py; z-lab's MLX backend too): keep
  the state before a step and the step's inputs (q, k, v, g, beta); the next step first
  runs the rule again over the committed tokens, then over its own;
- per-position states (SGLang's intermediate states; specgen's first version): keep the
  state after every token of a step in a ring of slots; rolling back is reading a slot.
Per layer, on random inputs at a real model's shapes, each against the rule alone (no
rollback at all) and the whole layer's forward (projections, conv, norms, MLP), with the
extra memory each needs. Timing only; both are exact (tests/test_hybrid_state.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from pathlib import Path

import torch

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"


def _best(fn, repeats: int, device: torch.device) -> float:
    best = float("inf")
    for attempt in range(repeats + 1):  # the first warms up
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if attempt:
            best = min(best, time.perf_counter() - start)
    return best


def _rule(rule, block, state):
    rule(*block, state)


def _tape_replay(replay, block, state, tape, accepted, start):
    replay(*block, state, tape, accepted + 1, start)  # the anchor and the accepted drafts


def _per_position(rule, block, ring, slots):
    keep = ring.new_empty((1, slots.shape[0], *ring.shape[2:]))
    rule(*block, ring.index_select(1, slots[:1] - 1)[:, 0], keep)
    ring.index_copy_(1, slots, keep)


def _layer(layer, cache, x, layer_id, tokens):
    cache.rollback(0)
    cache.begin(tokens, prefill=False)
    layer(x, None, None, cache, layer_id, None, False)


def main() -> None:
    from specgen.core.config import LINEAR
    from specgen.kernels.gated_delta import gated_delta_recurrent, gated_delta_replay
    from specgen.models.cache.hybrid import HybridCache
    from specgen.models.families import model_args
    from specgen.models.layers.gated_deltanet import GatedDeltaNetLayer

    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--shape", default="9b", choices=["4b", "9b", "27b"])
    parser.add_argument("--tokens", default="1,4,8,16")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    a = parser.parse_args()
    device = torch.device(a.device)
    cfg = json.loads((FIXTURES / f"qwen3.5-{a.shape}.config.json").read_text())
    args = model_args(cfg, name=f"qwen3.5-{a.shape}")
    hy = args.hybrid
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    gen = torch.Generator(device=device).manual_seed(0)
    layer = GatedDeltaNetLayer(args, dtype, device)
    for p in layer.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen, device=device) * 0.02)
    layer.decay.data.uniform_(0.0, 2.0).exp_().neg_()  # -exp(A_log), A_log in [0, 2]
    mib = hy.value_heads * hy.key_dim * hy.value_dim * 4 / 2**20  # one state, fp32
    layers = hy.layer_types.count(LINEAR)
    print(f"qwen3.5-{a.shape}: Hv {hy.value_heads}, dk {hy.key_dim}, dv {hy.value_dim}: "
          f"{mib:.1f} MiB per state, {layers} such layers; {device.type}, "
          f"{str(dtype).split('.')[-1]} weights, fp32 state")  # fmt: skip
    rows = []
    for t in (int(x) for x in a.tokens.split(",")):

        def rand(*shape):
            return torch.randn(*shape, generator=gen, device=device)

        def unit(*shape):
            return torch.nn.functional.normalize(rand(*shape), dim=-1)

        def draw(n):
            return (
                unit(1, n, hy.key_heads, hy.key_dim) * hy.key_dim**-0.5,
                unit(1, n, hy.key_heads, hy.key_dim),
                rand(1, n, hy.value_heads, hy.value_dim),
                -torch.rand(1, n, hy.value_heads, generator=gen, device=device),
                torch.rand(1, n, hy.value_heads, generator=gen, device=device),
            )

        block, tape = draw(t), draw(t)
        state = rand(1, hy.value_heads, hy.key_dim, hy.value_dim)
        accepted = t // 2  # a partial acceptance
        ring = torch.zeros(1, 2 * t + 2, *state.shape[1:], device=device)
        slots = torch.arange(1, t + 1, device=device)
        cache = HybridCache(args, batch=1, capacity=4096, steps=t, dtype=dtype, device=device)
        x = rand(1, t, args.hidden_size).to(dtype)
        cases = {
            "rule": functools.partial(_rule, gated_delta_recurrent, block, state),
            "tape_replay": functools.partial(
                _tape_replay,
                gated_delta_replay,
                block,
                state,
                tape,
                min(accepted, t - 1),
                torch.empty_like(state),
            ),  # fmt: skip
            "per_position": functools.partial(
                _per_position, gated_delta_recurrent, block, ring, slots
            ),
            "layer": functools.partial(_layer, layer, cache, x, hy.layer_types.index(LINEAR), t),
        }
        row = {"tokens": t, **{k: 1e3 * _best(fn, a.repeats, device) for k, fn in cases.items()}}
        row["memory_mib"] = {  # per layer, beyond the live state
            "tape_replay": 2 * mib,  # two generations of (base state, small tape)
            "per_position": (2 * t + 2) * mib,  # a ring of states (two steps' worth)
        }
        rows.append(row)
        print(f"T={t:2d}: rule {row['rule']:7.2f} ms | tape replay (a={accepted}) "
              f"{row['tape_replay']:7.2f} | per-position states {row['per_position']:7.2f} | "
              f"whole layer {row['layer']:7.2f} ms | extra memory per layer: tape "
              f"{2 * mib:.0f} MiB, per-position {(2 * t + 2) * mib:.0f} MiB")  # fmt: skip
    if a.out:
        Path(a.out).write_text(json.dumps({"shape": a.shape, "device": a.device, "rows": rows}))


if __name__ == "__main__":
    main()
