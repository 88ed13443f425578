"""The fused CPU pass of two versions of the kernels, side by side in one process: each git
ref's kernels/cpu sources built as this CPU's best library, the pass's C function swapped
call by call, so both see the same machine from moment to moment (this VM's run-to-run
noise, 10-30%, swamps a few percent between processes). Per call shape the median of
`--calls` calls each, and whether the two gave the same logits bit for bit.

    python benchmarks/pass_ab.py --refs HEAD~1 HEAD --contexts 100,800

Shapes: one answer of 1, 4, 8 and 64 rows, and 4 and 8 answers of one row each (their own
caches), after each context; then answers at different contexts in one pass (--mixed, as a
server's slots are: 8 one-row answers, and a 64-row prompt chunk beside 7 of them). Run
with SPECGEN_CPU_THREADS=fixed, so both libraries run with the same thread count. The
embedded default model; timings only.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "src/specgen/kernels/cpu"


def build(ref: str, out_dir: Path) -> Path:
    """`ref`'s kernel sources compiled as this CPU's best variant, with its flags."""
    from specgen.kernels import cpu_build

    variant = cpu_build.candidates("native")[0]
    src = out_dir / ref.replace("/", "_")
    src.mkdir(parents=True)
    for name in (*cpu_build.SOURCES, *cpu_build.HEADERS):
        text = subprocess.run(["git", "show", f"{ref}:{KERNELS}/{name}"], cwd=ROOT,
                              check=True, capture_output=True).stdout  # fmt: skip
        (src / name).write_bytes(text)
    lib = src / "pass.so"
    cmd = [cpu_build.compiler(), *cpu_build.BASE_FLAGS, *variant.flags, "-o", str(lib),
           *(str(src / s) for s in cpu_build.SOURCES), "-lm"]  # fmt: skip
    subprocess.run(cmd, check=True)
    print(f"{ref}: the {variant.name} build", flush=True)
    return lib


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", nargs=2, default=["HEAD~1", "HEAD"], metavar=("BASE", "NEW"))
    ap.add_argument("--contexts", default="100,800")
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument(
        "--mixed",
        default="100,300,500,700,900,1100,1300,1500",
        help="the contexts of the mixed passes' 8 answers ('' for none)",
    )
    args = ap.parse_args()

    from specgen.api.pipeline import Pipeline
    from specgen.cli.common import quiet_libraries
    from specgen.kernels import decoder_cpu
    from specgen.models.fused import cpu_pass

    quiet_libraries()
    model = Pipeline.load("smollm2-135m").model
    fused = cpu_pass.FusedPass.of(model)
    ref = decoder_cpu.decoder_forward_many()
    funcs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.refs:
            f = ctypes.CDLL(str(build(name, Path(tmp)))).decoder_forward_many
            f.argtypes, f.restype = ref.argtypes, ref.restype
            funcs[name] = f
    now = [ref]
    cpu_pass.decoder_forward_many = lambda: now[0]  # the pass asks for its function per call

    def filled(n: int):
        cache = model.new_cache(n + 80)
        x = torch.randint(0, 1000, (1, n), generator=torch.Generator().manual_seed(n))
        for s in range(0, n, 500):
            model(x[:, s : s + 500], cache)
        return cache

    print(f"{'context':>7} {'call':<14}" + "".join(f"{r:>14}" for r in args.refs) + "   same")

    def race(context: str, label: str, parts) -> None:
        seconds = {name: [] for name in funcs}
        logits = {}
        for _ in range(args.calls):
            for name, f in funcs.items():
                now[0] = f
                start = time.perf_counter()
                out = fused.run_many(model, parts, ())
                seconds[name].append(time.perf_counter() - start)
                logits[name] = torch.cat([o[0] for o in out])
        same = torch.equal(*logits.values())
        ms = "".join(f"{1e3 * statistics.median(s):11.2f} ms" for s in seconds.values())
        print(f"{context:>7} {label:<14}{ms}   {same}", flush=True)

    for context in (int(c) for c in args.contexts.split(",") if c):
        caches = [filled(context) for _ in range(8)]
        shapes = {
            "1 row": [([5], caches[0], 1)],
            "4 rows": [([5] * 4, caches[0], 1)],
            "8 rows": [([5] * 8, caches[0], 1)],
            "64 rows": [([5] * 64, caches[0], 1)],
            "4 answers": [([5], c, 1) for c in caches[:4]],
            "8 answers": [([5], c, 1) for c in caches],
        }
        for label, parts in shapes.items():
            race(str(context), label, parts)
    if args.mixed:
        caches = [filled(int(c)) for c in args.mixed.split(",")]
        race("mixed", "8 answers", [([5], c, 1) for c in caches])
        ones = [([5], c, 1) for c in caches]
        race("mixed", "64 + 7 answers", [([5] * 64, caches[0], 1), *ones[1:]])
        race("mixed", "7 + 64 rows", [*ones[:-1], ([5] * 64, caches[-1], 1)])
    sys.stdout.flush()


if __name__ == "__main__":
    main()
