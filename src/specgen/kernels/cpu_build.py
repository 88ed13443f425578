"""Building and loading the CPU kernels (kernels/cpu/*.c): one shared library per ISA.

Each x86 variant is the same sources compiled for one instruction set (its own code paths:
8-bit dot products on VNNI, 16 or 8 lanes, portable C). `pip install` builds them all ahead
of time (setup.py calls `compile_variant`), so an installed wheel runs at full speed on a
machine without a C compiler; at run time the best variant this CPU can execute is loaded
(its /proc/cpuinfo flags). A source checkout without built libraries, or whose libraries
no longer match their sources, compiles the variant it needs on first use into
$SPECGEN_HOME/kernels, keyed by the sources, the compiler and the flags, and for a
`-march=native` build (machines other than x86) by what the compiler sees of this CPU: a
home shared by machines never hands one a library the other built for itself.

`SPECGEN_CPU_ISA` picks a variant instead (`native`, the default, means the best one): the
tests run each code path on one machine this way. Nothing here imports torch or the rest
of specgen at module level, so setup.py can load this file on its own.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent / "cpu"
# one library: the products and the fused decoder pass that calls them (decoder.c)
SOURCES = ("packed.c", "common.c", "f32x8.c", "f32x16.c", "q8.c", "q8x8.c", "q8x16.c", "q8amx.c",
           "decoder.c")  # fmt: skip
HEADERS = ("packed.h",)
BASE_FLAGS = ("-O3", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC")
PREFIX = "_packed_"  # kernels/cpu/_packed_<variant>.so: the libraries pip builds

# x86-64-v3 and -v4 spelled out (compilers older than the level names accept these), with
# the /proc/cpuinfo flags each needs
V3 = ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2", "-mlzcnt", "-mmovbe")
V3_CPU = ("avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe")
V4 = V3 + ("-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")
V4_CPU = V3_CPU + ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")


@dataclass(frozen=True)
class Variant:
    name: str
    flags: tuple[str, ...]
    needs: tuple[str, ...]  # /proc/cpuinfo flags
    prebuilt: bool = True  # built by pip install


X86 = (  # best first
    # AVX-512 VNNI with AMX's int8 tiles for many rows (q8amx.c)
    Variant(
        "amx",
        ("-march=x86-64", *V4, "-mavx512vnni", "-mamx-tile", "-mamx-int8"),
        (*V4_CPU, "avx512_vnni", "amx_tile", "amx_int8"),
    ),
    Variant("avx512vnni", ("-march=x86-64", *V4, "-mavx512vnni"), (*V4_CPU, "avx512_vnni")),
    Variant("avx512", ("-march=x86-64", *V4), V4_CPU),
    Variant("avxvnni", ("-march=x86-64", *V3, "-mavxvnni"), (*V3_CPU, "avx_vnni")),
    Variant("avx2", ("-march=x86-64", *V3), V3_CPU),
    Variant("portable", ("-march=x86-64",), ()),
)
# the 8-lane VNNI kernels where the CPU has AVX-512 VNNI but not AVX-VNNI (this build's
# 256-bit vpdpbusd encoding): how such a machine tests the avxvnni code path; never prebuilt
AVXVNNI_AS_512 = Variant(
    "avxvnni", ("-march=x86-64", *V4, "-mavx512vnni", "-DSPECGEN_NARROW"),
    (*V4_CPU, "avx512_vnni"), prebuilt=False,
)  # fmt: skip
OTHER = (  # any other machine: what the compiler makes of it, or plain C
    Variant("native", ("-march=native",), (), prebuilt=False),
    Variant("portable", (), ()),
)


def is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def variants() -> tuple[Variant, ...]:
    return X86 if is_x86() else OTHER


@functools.cache
def cpu_flags() -> frozenset[str] | None:
    """This CPU's feature flags as Linux lists them (features the OS does not enable are
    left out), or None where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return frozenset(line.split(":", 1)[1].split())
    return None


def missing(v: Variant) -> tuple[str, ...]:
    """What this CPU lacks of what `v` needs (all of it when the flags are unknown)."""
    flags = cpu_flags()
    if flags is None:
        return v.needs
    return tuple(f for f in v.needs if f not in flags)


def candidates(isa: str) -> list[Variant]:
    """The variants to try for SPECGEN_CPU_ISA=isa, best first."""
    if isa == "native":
        if is_x86() and cpu_flags() is None:  # flags unknown: what the compiler sees, or C
            return list(OTHER)
        return [v for v in variants() if not missing(v)]
    named = {v.name: v for v in variants()}
    if isa not in named:
        raise OSError(f"SPECGEN_CPU_ISA={isa!r}: use one of native, {', '.join(named)}")
    v = named[isa]
    if v.name == "avxvnni" and missing(v) and not missing(AVXVNNI_AS_512):
        return [AVXVNNI_AS_512]
    if missing(v):
        raise OSError(f"SPECGEN_CPU_ISA={isa}: this CPU lacks {', '.join(missing(v))}")
    return [v]


def compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def source_hash(v: Variant) -> str:
    """What a library of `v` is built from: its sources and flags."""
    h = hashlib.sha256(" ".join((*BASE_FLAGS, *v.flags)).encode())
    for name in (*SOURCES, *HEADERS):
        h.update((HERE / name).read_bytes())
    return h.hexdigest()[:32]


def compile_variant(v: Variant, out: Path, cc: str) -> None:
    """Compile `v` into the library `out` (atomically: a concurrent build leaves one whole
    library); OSError with the compiler's last line on failure."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    flags = (*BASE_FLAGS, *v.flags, f'-DSPECGEN_SOURCE_HASH="{source_hash(v)}"')
    try:
        done = subprocess.run(
            [cc, *flags, "-o", tmp, *(str(HERE / s) for s in SOURCES), "-lm"],
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise OSError(done.stderr.strip().splitlines()[-1] if done.stderr else "failed")
        os.chmod(tmp, 0o755)  # mkstemp made it private; others load it too
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def prebuilt(v: Variant) -> ctypes.CDLL | None:
    """pip's library of `v`, if it is there and built from the sources beside it."""
    path = HERE / f"{PREFIX}{v.name}.so"
    if not v.prebuilt or not path.is_file():
        return None
    lib = ctypes.CDLL(str(path))
    lib.packed_source_hash.restype = ctypes.c_char_p
    return lib if lib.packed_source_hash().decode() == source_hash(v) else None


def cached_path(v: Variant, cc: str) -> Path:
    """Where `v` compiled here is kept: one file per sources, compiler and flags, and for a
    -march=native build per what the compiler makes of this CPU (and its flags)."""
    from specgen.core.paths import specgen_home

    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    key = version + source_hash(v)
    if "-march=native" in v.flags:
        seen = subprocess.run([cc, "-march=native", "-E", "-v", "-x", "c", os.devnull],
                              capture_output=True, text=True)  # fmt: skip
        key += " ".join(line for line in seen.stderr.splitlines() if "cc1" in line)
        key += str(sorted(cpu_flags() or ()))
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return specgen_home() / "kernels" / f"packed-{v.name}-{digest}.so"


def on_demand(v: Variant, cc: str) -> ctypes.CDLL:
    """`v` compiled here (once: cached_path)."""
    out = cached_path(v, cc)
    if not out.is_file():
        from specgen.core.once import building  # here: setup.py loads this file alone

        with building(f"the CPU kernels ({out.name})", out.parent):  # said once, timed
            compile_variant(v, out, cc)
    return ctypes.CDLL(str(out))


def load(isa: str) -> tuple[ctypes.CDLL, Variant]:
    """The library for SPECGEN_CPU_ISA=isa: pip's, else compiled here, best variant first.
    OSError saying why when there is none."""
    why: list[str] = []
    for v in candidates(isa):
        lib = prebuilt(v)
        if lib is not None:
            return lib, v
        cc = compiler()
        if cc is None:
            why.append(f"{v.name}: not built at install and no C compiler (set CC)")
            continue
        try:
            return on_demand(v, cc), v
        except OSError as e:
            why.append(f"{v.name}: {e}")
    raise OSError("; ".join(why) or "no variant for this CPU")
