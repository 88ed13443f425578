"""Where an eager (no CUDA graphs) AR decoding step spends its time at real model shapes:
each step's wall time (are they even, or do some spike, e.g. on a kernel compile?), then
a torch.profiler table of the steps after the first few.

    python benchmarks/profile_eager_steps.py [--target tests/fixtures/qwen3-8b.config.json]
        [--device cuda] [--context 512] [--steps 24] [--out F.txt]

Random weights; greedy AR through `engine/ar.py` as `specgen --no-cuda-graphs` runs it.
Run by scripts/gpu_check.sh.
"""

from __future__ import annotations

import json
import time

import torch
from shapes_bench import _sync, build, loop_parser


def main() -> None:
    parser = loop_parser(__doc__)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args()

    from specgen.core.config import SamplingParams
    from specgen.engine.ar import generate_ar

    target, _ = build(json.loads(args.target.read_text()), args.device, getattr(torch, args.dtype))
    device = target.device
    cache = target.new_cache(args.context + args.steps + 8)
    prompt = torch.randint(0, target.args.vocab_size, (args.context,)).tolist()
    events = generate_ar(
        target, cache, prompt, params=SamplingParams(), max_new_tokens=args.steps + 1,
        stop_ids=frozenset(), lookahead=False,
    )  # fmt: skip
    next(events)  # the prefill
    times = []
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    half = args.steps // 2
    with torch.profiler.profile(activities=activities) as prof:
        for i, _ in enumerate(events):
            _sync(device)
            times.append(time.perf_counter())
            if i == half:
                prof.step()
    steps_ms = [round((b - a) * 1e3, 2) for a, b in zip(times, times[1:], strict=False)]
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25)
    text = f"per-step ms: {steps_ms}\n\n{table}"
    if device.type == "cuda":
        text += "\n" + prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
