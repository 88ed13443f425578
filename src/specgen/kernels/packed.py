"""y = x W^T for a packed W (models/formats/packed_matrix.py), on whatever device x is.

- CPU: `kernels/cpu/packed.c` and its kernels, built ahead of time per instruction set
  (or on first use in a source checkout: kernels/cpu_build.py) and called through ctypes;
  it runs on its own OpenMP threads, as many as torch's.
- CUDA: the Triton kernel in kernels/packed_triton.py.
- Anywhere else, or with no library: `packed_linear_torch`, which dequantizes the matrix on
  every call (correct, slow; a one-time notice says so).

`packed_linear_torch` is the reference every fp32-activation kernel is tested against; the
8-bit-activation products (SPECGEN_CPU_ACT=q8) have their own in the tests.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from specgen.kernels.library import (  # noqa: F401  (the names callers import from here)
    ACTIVATIONS,
    DEFAULT_ACTIVATIONS,
    Q8_PORTABLE,
    _loaded,
    activations,
    compiled,
    isa,
    kernel_isa,
    kernel_lanes,
)

# below this many multiply-adds one thread does the product: waking OpenMP's second thread
# (which sleeps after a few thousand spins, see specgen/__init__) costs more than it saves
MIN_PARALLEL_WORK = 1 << 18
# up to this many rows (decode steps, verify blocks) each column is unpacked into registers
# and used at once; more rows (prefill) go through scratch: benchmarks/packed_kernel_rows.py
DIRECT_ROWS = 16


def packed_linear_torch(x: torch.Tensor, m) -> torch.Tensor:
    """The reference: the dequantized matrix, multiplied as a dense one."""
    return F.linear(x, m.dequantize(dtype=x.dtype))


@functools.cache
def cpu_library():
    """The compiled packed product, or None."""
    lib = compiled()
    if lib is None:
        return None
    f = lib.packed_linear
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    c_int = ctypes.c_int
    f.argtypes = [p, i64, i64, p, c_int, p, p, c_int, i64, i64, p, p, c_int, i64, c_int]
    f.restype = ctypes.c_int
    return f


def q8_quantize_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] (K a multiple of 32) as the q8 products quantize it: q int8 [M, K] and d
    [M, K/32] (kernels/cpu/packed.h). For tests and measurements."""
    lib = compiled()
    if lib is None:
        raise RuntimeError("no CPU kernels")
    x = x.float().contiguous()
    rows, k = x.shape
    q, d = torch.empty(rows, k, dtype=torch.int8), torch.empty(rows, k // 32)
    sums = torch.empty(rows, k // 16, dtype=torch.int32)
    lib.q8_quantize.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_void_p]  # fmt: skip
    lib.q8_quantize(x.data_ptr(), rows, k, q.data_ptr(), d.data_ptr(), sums.data_ptr())
    return q, d


def kernel_threads() -> int:
    """Threads for one packed product: torch's count (set by --threads)."""
    return torch.get_num_threads()


def packed_linear_cpu(
    x: torch.Tensor, m, direct_rows: int = DIRECT_ROWS, act: str | None = None
) -> torch.Tensor:
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
    code = Q8_PORTABLE if act == "q8-portable" else ACTIVATIONS[act or activations()]
    mins, sums = m.mins, 0
    if mins is not None:
        if not code:  # x's group sums, for the fp32 kernels
            scratch = torch.empty(rows * (k // m.group))
            sums = scratch.data_ptr()
        mins = mins.data_ptr()
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
        code,
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
