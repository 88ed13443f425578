"""The CPU kernels' library, found and loaded without torch: which instruction-set variant
runs (kernels/cpu_build.py), and what the products multiply. The fused pass, the packed
products and the fast start of `generate` (api/quick.py) all load it from here.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

from specgen.kernels import cpu_build

# SPECGEN_CPU_ACT: what the CPU products multiply the packed weights with (decoder.c's too)
ACTIVATIONS = {"fp32": 0, "q8": 1}
DEFAULT_ACTIVATIONS = "q8"  # faster at every row count, as close to the file as llama.cpp
Q8_PORTABLE = 2  # q8 on the portable kernel in any build: tests hold the vector ones to it


def isa() -> str:
    return os.environ.get("SPECGEN_CPU_ISA", "native").lower()


@functools.cache
def compiled() -> ctypes.CDLL | None:
    """The CPU library, or None (none built and none can be: noticed once)."""
    return _loaded()[0]


@functools.cache
def _loaded() -> tuple[ctypes.CDLL | None, str]:
    if os.environ.get("SPECGEN_PACKED_CPU", "").lower() == "torch":
        return None, ""
    try:
        lib, variant = cpu_build.load(isa())
    except OSError as e:
        print(f"specgen: packed weights run slowly: no CPU kernels ({e})", file=sys.stderr)
        return None, ""
    lib.packed_isa.restype = ctypes.c_char_p
    return lib, variant.name


def kernel_lanes() -> int:
    """The vector width the compiled products use: 16 (AVX-512), 8 (AVX2) or 1 (portable C);
    0 without a compiled library."""
    lib = compiled()
    return 0 if lib is None else lib.packed_lanes()


def kernel_isa() -> str:
    """Which library runs and what it was built for, "avx512vnni (avx512+vnni)"; "" without
    one."""
    lib, variant = _loaded()
    return "" if lib is None else f"{variant} ({lib.packed_isa().decode()})"


KV_KINDS = ("f16", "f32")


def kv_kind() -> str:
    """How targets the fused CPU pass runs keep their keys and values (SPECGEN_CPU_KV):
    `f16` (the default, as llama.cpp's; docs/design.md says why) or `f32`
    (models/fused/cpu_pass.kv_dtype)."""
    kind = os.environ.get("SPECGEN_CPU_KV", "f16").lower()
    if kind not in KV_KINDS:
        raise ValueError(f"SPECGEN_CPU_KV={kind!r}: use one of {', '.join(KV_KINDS)}")
    return kind


def activations() -> str:
    """`fp32` (x as it is) or `q8` (each row quantized to 8 bits per block of 32, as
    llama.cpp does: integer block products, cheap extra rows; packed.h)."""
    act = os.environ.get("SPECGEN_CPU_ACT", DEFAULT_ACTIVATIONS).lower()
    if act not in ACTIVATIONS:
        raise ValueError(f"SPECGEN_CPU_ACT={act!r}: use one of {', '.join(ACTIVATIONS)}")
    return act


def amx(on: bool | None = None) -> bool:
    """Whether products of many rows with 4-bit weights run on AMX's tiles (the amx build,
    where the CPU and Linux allow; SPECGEN_CPU_AMX=0 says no); `on` sets it for this
    process (tests hold the two paths to the same bits)."""
    lib = compiled()
    if lib is None:
        return False
    return bool(lib.packed_amx(-1 if on is None else int(on)))
