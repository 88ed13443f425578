"""The CPU kernels' libraries (kernels/cpu_build.py, setup.py): built per instruction set at
install, the best one this CPU runs loaded without a compiler, rebuilt when they no longer
match their sources, and a cached build never handed to a CPU it was not made for."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.kernels import cpu_build

ROOT = Path(__file__).resolve().parents[1]
PROBE = """
import torch
from specgen.kernels.packed import kernel_isa, packed_linear_cpu
from specgen.models.formats.packed_matrix import quantize
m = quantize(torch.randn(40, 256), 4, 32)
x = torch.randn(3, 256)
assert torch.allclose(packed_linear_cpu(x, m, act="fp32"), x @ m.dequantize().T, atol=1e-4)
assert (packed_linear_cpu(x, m, act="q8") - x @ m.dequantize().T).abs().max() < 1.0
print(kernel_isa())
"""

pytestmark = [
    pytest.mark.integration,  # compiles every variant, runs subprocesses
    pytest.mark.skipif(cpu_build.compiler() is None, reason="no C compiler"),
]


def installed(tmp_path: Path) -> Path:
    """What a wheel holds: the package, and the libraries setup.py builds next to it."""
    pytest.importorskip("setuptools")
    site = tmp_path / "site"
    shutil.copytree(ROOT / "src" / "specgen", site / "specgen",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))  # fmt: skip
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib", str(site),
                           "--build-temp", str(tmp_path / "tmp")],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return site


def without_compiler(site: Path, home: Path, code: str = PROBE) -> subprocess.CompletedProcess:
    bare = home / "bin"  # PATH: nothing but this empty folder, so no cc, gcc or clang
    bare.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "PATH", "SPECGEN_CPU_ISA")}
    env.update(PATH=str(bare), PYTHONPATH=str(site), SPECGEN_HOME=str(home / "specgen"))
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_an_install_runs_its_best_library_where_there_is_no_compiler(tmp_path):
    site = installed(tmp_path)
    built = sorted(p.name for p in (site / "specgen/kernels/cpu").glob("_packed_*.so"))
    assert built == sorted(f"_packed_{v.name}.so" for v in cpu_build.variants() if v.prebuilt)
    done = without_compiler(site, tmp_path / "home")
    assert done.returncode == 0, done.stderr
    best = cpu_build.candidates("native")[0]
    assert done.stdout.split()[0] == best.name, done.stdout  # the fast path, as installed
    assert not (tmp_path / "home" / "specgen").exists()  # nothing compiled, nothing cached
    assert "slowly" not in done.stderr


def test_libraries_that_no_longer_match_their_sources_are_not_loaded(tmp_path):
    site = installed(tmp_path)
    source = site / "specgen/kernels/cpu/q8.c"
    source.write_text(source.read_text() + "\n/* edited */\n")
    done = without_compiler(site, tmp_path / "home")  # stale, and nothing to rebuild with
    assert done.returncode == 0, done.stderr
    assert "packed weights run slowly" in done.stderr and "no C compiler" in done.stderr
    env = {**os.environ, "PYTHONPATH": str(site), "SPECGEN_HOME": str(tmp_path / "h2")}
    env.pop("SPECGEN_CPU_ISA", None)
    rebuilt = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True,
                             text=True, timeout=600)  # fmt: skip
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert list((tmp_path / "h2" / "kernels").glob("packed-*.so"))  # compiled on first use


def test_a_native_build_is_cached_per_cpu(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECGEN_HOME", str(tmp_path))
    native = cpu_build.OTHER[0]
    cc = cpu_build.compiler()
    paths = set()
    for flags in (frozenset({"avx2", "fma"}), frozenset({"avx2", "fma", "avx512f"})):
        monkeypatch.setattr(cpu_build, "cpu_flags", lambda flags=flags: flags)
        paths.add(cpu_build.cached_path(native, cc))
    assert len(paths) == 2
    x86 = cpu_build.X86[0]  # explicit flags: one build serves every CPU that has them
    assert cpu_build.cached_path(x86, cc) == cpu_build.cached_path(x86, cc)


@pytest.mark.skipif(not cpu_build.is_x86(), reason="x86 variants")
def test_a_variant_this_cpu_cannot_run_is_never_loaded(monkeypatch):
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: frozenset({"sse2", "avx", "avx2", "fma"}))
    assert [v.name for v in cpu_build.candidates("native")] == ["portable"]  # no bmi2, f16c...
    with pytest.raises(OSError, match="SPECGEN_CPU_ISA=avx512vnni: this CPU lacks f16c, "):
        cpu_build.candidates("avx512vnni")
    unknown = "SPECGEN_CPU_ISA='avx9000': use one of native, amx, avx512vnni"
    with pytest.raises(OSError, match=unknown):
        cpu_build.candidates("avx9000")
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: None)  # unknown: what the compiler sees
    assert [v.name for v in cpu_build.candidates("native")] == ["native", "portable"]
