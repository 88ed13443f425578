"""Each code path of the CPU kernels, whatever this machine runs natively.

The products come in three builds: 16 lanes (kernels/cpu/packed_wide.c, AVX-512), 8 lanes
(packed.c, AVX2) and portable C. -march=native picks one, so a machine tests only its own;
SPECGEN_CPU_ISA narrows the build, and here each narrower build reruns the exactness tests
(the dequantized product, rows independent of the rows beside them, the fused pass against a
float64 model, every method greedy-identical to AR) in a process of its own.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from specgen.kernels.packed import ISA_FLAGS, cpu_library

HERE = Path(__file__).parent
pytestmark = [
    pytest.mark.integration,  # each build compiled and run in a subprocess of its own
    pytest.mark.skipif(cpu_library() is None, reason="no C compiler"),
    pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="x86 flags"),
]
EXACTNESS = (
    "test_packed.py::test_packed_products_are_the_dequantized_product",
    "test_packed.py::test_a_rows_result_does_not_depend_on_the_rows_beside_it",
    "test_fused_cpu.py::test_the_fused_pass_computes_the_files_model",
    "test_fused_cpu.py::test_a_rows_result_never_depends_on_the_rows_or_threads_beside_it",
    "test_packed_methods.py::test_every_method_is_greedy_identical_to_ar_with_packed_weights",
)


def in_build(isa: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECGEN_CPU_ISA": isa}
    return subprocess.run([sys.executable, *args], cwd=HERE, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def has_avx2() -> bool:
    try:
        return " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return True  # not Linux: x86-64 machines of today have it


@pytest.mark.parametrize("isa,lanes", [("avx2", (8,)), ("portable", (1,))])
def test_each_narrower_build_runs_its_own_path_exactly(isa, lanes):
    if isa == "avx2" and not has_avx2():
        lanes = (1,)  # a CPU without AVX2 builds the portable path for it
    probe = "from specgen.kernels.packed import kernel_lanes; print(kernel_lanes())"
    got = in_build(isa, "-c", probe)
    assert got.returncode == 0, got.stderr
    assert int(got.stdout.split()[-1]) in lanes
    done = in_build(isa, "-m", "pytest", "-q", "-p", "no:cacheprovider", *EXACTNESS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_an_unknown_isa_is_named_and_the_slow_path_runs():
    code = (
        "import torch; from specgen.kernels.packed import kernel_lanes, packed_linear;"
        "from specgen.models.formats.packed_matrix import quantize; m = quantize(torch.randn(8, 64), 4, 32);"
        "x = torch.randn(2, 64); y = packed_linear(x, m);"
        "assert torch.allclose(y, x @ m.dequantize().T, atol=1e-4); print(kernel_lanes())"
    )
    got = in_build("avx9000", "-c", code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[-1] == "0"
    line = [s for s in got.stderr.splitlines() if "SPECGEN_CPU_ISA" in s]
    assert len(line) == 1 and all(isa in line[0] for isa in ISA_FLAGS), got.stderr
