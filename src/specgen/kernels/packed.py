"""y = x W^T for a packed W (models/formats/packed_matrix.py), on whatever device x is.

- CPU: `kernels/cpu/packed.c`, compiled once per machine with the system C compiler
  (`-O3 -march=native`; cached under $SPECGEN_HOME/kernels, keyed by the source and the
  compiler) and called through ctypes; it runs on torch's OpenMP threads.
- CUDA: the Triton kernel in kernels/packed_triton.py.
- Anywhere else, or with no compiler: `packed_linear_torch`, which dequantizes the matrix on
  every call (correct, slow; a one-time notice says so).

`packed_linear_torch` is the reference every kernel is tested against.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from specgen.core.once import building
from specgen.core.paths import specgen_home

SOURCE = Path(__file__).parent / "cpu" / "packed.c"
# one library: the packed products and the fused decoder pass that calls them (decoder.c)
SOURCES = (SOURCE, SOURCE.with_name("packed_wide.c"), SOURCE.with_name("decoder.c"))
HEADERS = (SOURCE.with_name("packed.h"),)
# below this many multiply-adds one thread does the product: waking OpenMP's second thread
# (which sleeps after a few thousand spins, see specgen/__init__) costs more than it saves
MIN_PARALLEL_WORK = 1 << 18
# up to this many rows (decode steps, verify blocks) each column is unpacked into registers
# and used at once; more rows (prefill) go through scratch: benchmarks/packed_kernel_rows.py
DIRECT_ROWS = 16
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
# SPECGEN_CPU_ISA narrows what -march=native may use: each narrower build runs its own code
# path (packed_wide.c's 16 lanes, packed.c's 8, its portable C), so one machine can test all
ISA_FLAGS = {
    "native": (),
    "avx2": ("-mno-avx512f",),
    "portable": ("-mno-avx512f", "-mno-avx2", "-mno-fma"),
}


def packed_linear_torch(x: torch.Tensor, m) -> torch.Tensor:
    """The reference: the dequantized matrix, multiplied as a dense one."""
    return F.linear(x, m.dequantize(dtype=x.dtype))


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _flags() -> tuple[str, ...]:
    isa = os.environ.get("SPECGEN_CPU_ISA", "native").lower()
    if isa not in ISA_FLAGS:
        raise OSError(f"SPECGEN_CPU_ISA={isa!r}: use one of {', '.join(ISA_FLAGS)}")
    return FLAGS + ISA_FLAGS[isa]


def _build(cc: str) -> Path:
    flags = _flags()
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    text = "".join(p.read_text() for p in (*SOURCES, *HEADERS))
    key = hashlib.sha256((text + version + " ".join(flags)).encode()).hexdigest()
    out = specgen_home() / "kernels" / f"packed-{key[:16]}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        with building(f"the CPU kernels ({out.name})", out.parent):  # said once, timed
            done = subprocess.run(
                [cc, *flags, "-o", tmp, *map(str, SOURCES), "-lm"], capture_output=True, text=True
            )
            if done.returncode:
                raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
            os.replace(tmp, out)  # atomic: a concurrent build leaves one whole library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def compiled() -> ctypes.CDLL | None:
    """The compiled CPU library, or None (no compiler, or it failed: noticed once)."""
    if os.environ.get("SPECGEN_PACKED_CPU", "").lower() == "torch":
        return None
    cc = _compiler()
    try:
        if cc is None:
            raise OSError("no C compiler (set CC)")
        return ctypes.CDLL(str(_build(cc)))
    except OSError as e:
        print(
            f"specgen: packed weights run slowly: cannot build {SOURCE.name} ({e})", file=sys.stderr
        )
        return None


@functools.cache
def cpu_library():
    """The compiled packed product, or None."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.packed_linear
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    f.argtypes = [p, i64, i64, p, ctypes.c_int, p, p, ctypes.c_int, i64, i64, p, p, ctypes.c_int, i64]
    f.restype = ctypes.c_int
    return f


def kernel_lanes() -> int:
    """The vector width the compiled products use: 16 (AVX-512), 8 (AVX2) or 1 (portable C);
    0 without a compiled library."""
    lib = compiled()
    return 0 if lib is None else lib.packed_lanes()


def kernel_threads() -> int:
    """Threads for one packed product: torch's count (set by --threads)."""
    return torch.get_num_threads()


def packed_linear_cpu(x: torch.Tensor, m, direct_rows: int = DIRECT_ROWS) -> torch.Tensor:
    # Lean on purpose: a decode step makes one call per matrix (over a hundred), and each
    # microsecond of Python here is a microsecond of every step.
    f = cpu_library()
    if f is None or x.dtype != torch.float32 or (x.requires_grad and torch.is_grad_enabled()):
        return packed_linear_torch(x, m)  # a drafter trained through the head: autograd
    n, k = m.shape
    if m.columns is not None:  # columns stored in another order: the inputs follow them
        x = x.index_select(-1, m.columns)
    elif not x.is_contiguous():
        x = x.contiguous()
    rows = x.numel() // k
    y = torch.empty(*x.shape[:-1], n)
    mins = m.mins
    if mins is None:
        sums = 0
    else:
        scratch = torch.empty(rows * (k // m.group))
        sums, mins = scratch.data_ptr(), mins.data_ptr()
    failed = f(
        x.data_ptr(),
        rows,
        k,
        m.q.data_ptr(),
        m.bits,
        m.scale.data_ptr(),
        mins,
        m.scale.dtype == torch.float16,
        n,
        m.group,
        y.data_ptr(),
        sums,
        1 if rows * n * k < MIN_PARALLEL_WORK else kernel_threads(),
        direct_rows,
    )
    if failed:
        raise MemoryError("packed matrix product: out of memory for scratch space")
    return y


def packed_linear(x: torch.Tensor, m) -> torch.Tensor:
    if x.device.type == "cpu":
        return packed_linear_cpu(x, m)
    if x.device.type == "cuda":
        from specgen.kernels.packed_triton import packed_linear_triton

        return packed_linear_triton(x, m)
    return packed_linear_torch(x, m)
