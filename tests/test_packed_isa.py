"""Each code path of the CPU kernels, whatever this machine runs natively.

The kernels come in one library per instruction set (kernels/cpu_build.py): AVX-512 with
VNNI and AMX's tiles, with VNNI (vpdpbusd) alone and without, AVX2 with AVX-VNNI (where a
CPU has AVX-512 VNNI instead, the same 8-lane code in its encoding) and without, portable C.
The best one runs by default, so a machine tests only its own; SPECGEN_CPU_ISA picks
another, and here each one this CPU can execute reruns the exactness tests in a process of
its own: the fp32-activation products (the dequantized product, rows independent of the
rows beside them, the fused pass against a float64 model, every method greedy-identical to
AR, the gate's e^x against libm's) where the build has its own fp32 kernel, and the
8-bit-activation ones everywhere (their reference, rows and threads, the fused pass, the
methods), and all builds' 8-bit products must be the same bits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specgen.kernels import cpu_build
from specgen.kernels.packed import cpu_library

HERE = Path(__file__).parent
pytestmark = [
    pytest.mark.integration,  # each build compiled and run in a subprocess of its own
    pytest.mark.skipif(cpu_library() is None, reason="no C compiler"),
    pytest.mark.skipif(not cpu_build.is_x86(), reason="x86 variants"),
]
FP32 = (
    "test_packed.py::test_packed_products_are_the_dequantized_product",
    "test_packed.py::test_a_rows_result_does_not_depend_on_the_rows_beside_it",
    "test_fused_cpu.py::test_the_fused_pass_computes_the_files_model",
    "test_fused_cpu.py::test_a_rows_result_never_depends_on_the_rows_or_threads_beside_it",
    "test_packed_methods.py::test_every_method_is_greedy_identical_to_ar_with_packed_weights",
    "test_fused_shared.py::test_each_answers_rows_in_a_shared_pass_are_its_own",
    "test_fused_cpu.py::test_the_gates_exp_is_libms_expf_bit_for_bit",
    "test_fused_attention.py",  # tiles two queries at a time (AVX-512), one (avx2), plain C
)
Q8 = (
    "test_packed_q8.py",
    "test_fused_cpu.py::test_a_rows_result_never_depends_on_the_rows_or_threads_beside_it",
    "test_fused_cpu.py::test_with_8_bit_activations_the_pass_computes_the_eager_layers_model",
    "test_packed_methods.py::test_every_method_is_greedy_identical_to_ar_with_packed_weights",
    "test_fused_shared.py::test_each_answers_rows_in_a_shared_pass_are_its_own",
)
# variant: the path its library reports, its fp32 lanes, and whether its fp32 products are
# a kernel of their own (else the same code as a build that tests them)
BUILDS = {
    "avx512vnni": ("avx512+vnni", 16, False),  # the vector kernels where the amx build runs
    "avx512": ("avx512", 16, False),  # the native build's 16-lane fp32 products
    "avxvnni": ("avx2+vnni", 8, False),  # the avx2 build's
    "avx2": ("avx2", 8, True),
    "portable": ("portable", 1, True),
}
PRODUCTS = """
import sys, numpy as np, torch
from support.packed import ALL_KINDS, random_blocks
from specgen.models.formats.gguf.blocks import packed_from_blocks
from specgen.models.formats.packed_matrix import quantize
from specgen.kernels.packed import packed_linear_cpu
gen = torch.Generator().manual_seed(0)
out = {}
for kind in ALL_KINDS:
    m = packed_from_blocks(kind, random_blocks(kind, 45, 512, np.random.default_rng(1)), 45, 512)
    out[kind] = packed_linear_cpu(torch.randn(19, 512, generator=gen), m, act="q8")
for bits, group in ((4, 64), (8, 16), (8, 256)):
    m = quantize(torch.randn(21, 512, generator=gen), bits, group)
    out[f"int{bits}-{group}"] = packed_linear_cpu(torch.randn(7, 512, generator=gen), m, act="q8")
torch.save(out, sys.argv[1])
"""


def in_build(isa: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECGEN_CPU_ISA": isa}
    return subprocess.run([sys.executable, *args], cwd=HERE, env=env, capture_output=True,
                          text=True, timeout=900)  # fmt: skip


def runnable(isa: str) -> bool:
    try:
        return bool(cpu_build.candidates(isa))
    except OSError:
        return False


@pytest.mark.parametrize("isa", list(BUILDS))
def test_each_build_runs_its_own_path_exactly(isa):
    if not runnable(isa):
        pytest.skip(f"this CPU cannot run the {isa} build")
    path, lanes, own_fp32 = BUILDS[isa]
    probe = ("from specgen.kernels.packed import kernel_isa, kernel_lanes;"
             "print(kernel_isa(), kernel_lanes())")  # fmt: skip
    got = in_build(isa, "-c", probe)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[-2:] == [f"({path})", str(lanes)], got.stdout
    if own_fp32:
        done = in_build(isa, "-m", "pytest", "-q", "-p", "no:cacheprovider", *FP32, "-k", "not q8")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    done = in_build(isa, "-m", "pytest", "-q", "-p", "no:cacheprovider", *Q8, "-k", "q8 or 8_bit")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


def test_every_build_computes_the_same_8_bit_products(tmp_path):
    """The integer block sums are exact and each output's fp32 steps are the same in every
    kernel, so a machine's build never changes an answer with 8-bit activations."""
    got = {}
    for isa in ("native", *BUILDS):
        if not runnable(isa):
            continue
        done = in_build(isa, "-c", PRODUCTS, str(tmp_path / f"{isa}.pt"))
        assert done.returncode == 0, done.stderr
        got[isa] = torch.load(tmp_path / f"{isa}.pt")
    assert len(got) >= 2
    first = got.pop("native")
    for isa, products in got.items():
        assert all(torch.equal(products[k], first[k]) for k in first), isa


def test_an_unknown_isa_is_named_and_the_slow_path_runs():
    code = (
        "import torch; from specgen.kernels.packed import kernel_lanes, packed_linear;"
        "from specgen.models.formats.packed_matrix import quantize;"
        "m = quantize(torch.randn(8, 64), 4, 32);"
        "x = torch.randn(2, 64); y = packed_linear(x, m);"
        "assert torch.allclose(y, x @ m.dequantize().T, atol=1e-4); print(kernel_lanes())"
    )
    got = in_build("avx9000", "-c", code)
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[-1] == "0"
    line = [s for s in got.stderr.splitlines() if "SPECGEN_CPU_ISA" in s]
    names = [v.name for v in cpu_build.variants()]
    assert len(line) == 1 and all(isa in line[0] for isa in names), got.stderr
