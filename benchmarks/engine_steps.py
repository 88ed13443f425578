"""AR decoding through the real loop at real model shapes: eager vs CUDA graphs, sync vs
overlap, and how much of each step the device sits idle (the host gap); then the time of
a whole DFlash and DSpark speculative step (every draft verified) the same ways and in the
device-resident loop (engine/resident.py).

    python benchmarks/engine_steps.py [--target tests/fixtures/qwen3-8b.config.json]
        [--device cuda] [--dtype bfloat16] [--context 512] [--tokens 64] [--out F.json]

Random weights (no Hub needed); greedy AR via `engine/ar.py`, as `specgen` runs it, so the
per-token time includes sampling, the host sync for each token and the Python around it.
Lookahead (the next forward queued before the host reads the token) is on except in the
run marked no-lookahead.
The device-idle share is 1 - (a replayed graph step alone) / (a step in the loop): what
the loop adds on top of the device's own work. Run by scripts/gpu_check.sh.
"""

from __future__ import annotations

import json
import time

import torch
from shapes_bench import _sync, build, graphed_seconds, loop_parser


def _loop_seconds(
    target,
    context: int,
    steps: int,
    *,
    graphs: bool,
    overlap: bool,
    lookahead: bool = True,
    method=None,
    resident: bool = False,
) -> float:
    """Seconds per decoding step after a `context`-token prompt: greedy AR, or with
    `method` a speculative step verifying every draft (random drafters: the drafts are
    rejected, so this times a full draft + verify step); `resident`: that step in the
    device-resident loop (engine/resident.py), queued before the last one is read."""
    from specgen.core.config import SamplingParams
    from specgen.engine.ar import generate_ar
    from specgen.engine.loop import generate_speculative
    from specgen.engine.overlap import overlapped
    from specgen.engine.resident import generate_resident
    from specgen.models.graphs import GraphedForward

    cuda = target.device.type == "cuda"
    drafts = method.max_draft_tokens if method is not None else 0
    capacity = context + (steps + 4) * (drafts + 1) + 1
    cache = target.new_cache(capacity)
    forward = target
    if graphs:
        forward = GraphedForward(target, cache, max_tokens=1 + drafts, capture=cuda)
    drafter = None
    if method is not None:
        method.cuda_graphs = graphs and cuda
        drafter = method.new_drafter(capacity)
    prompt = torch.randint(0, target.args.vocab_size, (context,)).tolist()

    def run(n: int) -> float:
        cache.rollback(0)
        if drafter is not None:
            drafter.rollback(0)

        def events():
            common = dict(params=SamplingParams(), max_new_tokens=n * (drafts + 1))
            if drafter is None:
                return generate_ar(
                    forward, cache, prompt, stop_ids=frozenset(),
                    lookahead=lookahead and cuda, **common,
                )  # fmt: skip
            loop = generate_resident if resident else generate_speculative
            return loop(forward, cache, drafter, prompt, stop_ids=frozenset(), **common)

        stream = iter(overlapped(events) if overlap else events())
        first = next(stream)  # the prefill is not part of a decoding step
        assert first.tokens
        _sync(target.device)
        start = time.perf_counter()
        count = 0
        for _ in stream:
            count += 1
            if count == n:
                break
        _sync(target.device)
        seconds = (time.perf_counter() - start) / max(count, 1)
        stream.close()
        return seconds

    run(4)  # warm-up (and capture)
    return run(steps)


def main() -> None:
    parser = loop_parser(__doc__)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    cfg = json.loads(args.target.read_text())
    target, methods = build(cfg, args.device, getattr(torch, args.dtype))
    replay = graphed_seconds(target, args.context, sizes=(1,))[1]
    report = {
        "target": args.target.name,
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "dtype": args.dtype,
        "context": args.context,
        "graph_replay_ms": replay * 1e3,
        "per_token_ms": {},
        "device_idle_share": {},
    }
    runs = [(g, o, True) for g in (False, True) for o in (False, True)] + [(True, False, False)]
    for graphs, overlap, lookahead in runs:
        name = f"{'graphs' if graphs else 'eager'}+{'overlap' if overlap else 'sync'}"
        name += "" if lookahead else "+no-lookahead"
        seconds = _loop_seconds(
            target, args.context, args.tokens, graphs=graphs, overlap=overlap,
            lookahead=lookahead,
        )  # fmt: skip
        report["per_token_ms"][name] = seconds * 1e3
        report["device_idle_share"][name] = max(0.0, 1 - replay / seconds)
        print(
            f"{name}: {seconds * 1e3:.2f} ms/token ({1 / seconds:.0f} tok/s), "
            f"device idle {max(0.0, 1 - replay / seconds):.0%}"
        )
    # a whole speculative step, every draft verified (DFlash: 5 layers, block 16, 15
    # drafts; DSpark: block 7): draft + verify + host, sync loop vs the resident loop
    steps = [
        ("eager+sync", False, False, False),
        ("graphs+sync", True, False, False),
        ("graphs+overlap", True, True, False),
        ("graphs+resident", True, False, True),
        ("graphs+overlap+resident", True, True, True),
        ("eager+overlap+resident", False, True, True),
    ]
    for kind in ("dflash", "dspark"):
        report[f"{kind}_step_ms"] = {}
        for name, graphs, overlap, resident in steps:
            seconds = _loop_seconds(
                target, args.context, args.tokens // 4, graphs=graphs, overlap=overlap,
                method=methods[kind], resident=resident,
            )  # fmt: skip
            report[f"{kind}_step_ms"][name] = seconds * 1e3
            print(f"{kind} step {name}: {seconds * 1e3:.2f} ms")
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report))


if __name__ == "__main__":
    main()
