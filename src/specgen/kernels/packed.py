"""y = x W^T for a packed W (models/packed.py), on whatever device x is.

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

from specgen.paths import specgen_home

SOURCE = Path(__file__).parent / "cpu" / "packed.c"
# below this many multiply-adds one thread does the product: waking OpenMP's second thread
# (which sleeps after a few thousand spins, see specgen/__init__) costs more than it saves
MIN_PARALLEL_WORK = 1 << 18
FLAGS = ("-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")


def packed_linear_torch(x: torch.Tensor, m) -> torch.Tensor:
    """The reference: the dequantized matrix, multiplied as a dense one."""
    return F.linear(x, m.dequantize(dtype=x.dtype))


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def _build(cc: str) -> Path:
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256((SOURCE.read_text() + version + " ".join(FLAGS)).encode()).hexdigest()
    out = specgen_home() / "kernels" / f"packed-{key[:16]}.so"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cc, *FLAGS, "-o", tmp, str(SOURCE), "-lm"], capture_output=True, text=True
        )
        if done.returncode:
            raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
        os.replace(tmp, out)  # atomic: a concurrent build leaves one whole library
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def cpu_library():
    """The compiled CPU kernel, or None (no compiler, or it failed: noticed once)."""
    if os.environ.get("SPECGEN_PACKED_CPU", "").lower() == "torch":
        return None
    cc = _compiler()
    try:
        if cc is None:
            raise OSError("no C compiler (set CC)")
        lib = ctypes.CDLL(str(_build(cc)))
    except OSError as e:
        print(
            f"specgen: packed weights run slowly: cannot build {SOURCE.name} ({e})", file=sys.stderr
        )
        return None
    f = lib.packed_linear
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    f.argtypes = [p, i64, i64, p, ctypes.c_int, p, p, i64, i64, p, p, ctypes.c_int]
    f.restype = ctypes.c_int
    return f


def packed_linear_cpu(x: torch.Tensor, m) -> torch.Tensor:
    f = cpu_library()
    grad = x.requires_grad and torch.is_grad_enabled()  # a drafter trained through the head
    if f is None or x.dtype != torch.float32 or grad:
        return packed_linear_torch(x, m)
    n, k = m.shape
    flat = x.reshape(-1, k).contiguous()
    rows = flat.shape[0]
    y = torch.empty(rows, n, dtype=torch.float32)
    sums = torch.empty(rows * (k // m.group) if m.mins is not None else 1)
    mins = None if m.mins is None else m.mins.data_ptr()
    failed = f(
        flat.data_ptr(),
        rows,
        k,
        m.q.data_ptr(),
        m.bits,
        m.scale.data_ptr(),
        mins,
        n,
        m.group,
        y.data_ptr(),
        sums.data_ptr(),
        torch.get_num_threads(),
    )
    if failed:
        raise MemoryError("packed matrix product: out of memory for scratch space")
    return y.view(*x.shape[:-1], n)


def packed_linear(x: torch.Tensor, m) -> torch.Tensor:
    if x.device.type == "cpu":
        return packed_linear_cpu(x, m)
    if x.device.type == "cuda":
        from specgen.kernels.packed_triton import packed_linear_triton

        return packed_linear_triton(x, m)
    return packed_linear_torch(x, m)
