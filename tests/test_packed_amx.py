"""Products of many rows on AMX's tiles (kernels/cpu/q8amx.c, the amx build): the same bits
as the vector kernel and the portable one, for every 4-bit format, row count around the
tile's 16, group and thread count, and through the fused pass; SPECGEN_CPU_AMX=0 turns them
off. Run where the CPU has the tiles (a Xeon from Sapphire Rapids on); elsewhere skipped,
and tests/test_packed_isa.py runs the vector build's own tests."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from specgen.kernels.library import amx, kernel_isa
from specgen.kernels.packed import cpu_library, packed_linear_cpu
from specgen.models.formats.gguf.blocks import packed_from_blocks
from specgen.models.formats.packed_matrix import quantize
from support.packed import LLAMA_MIXES, random_blocks, write_tiny_gguf

pytestmark = [
    pytest.mark.skipif(cpu_library() is None, reason="no C compiler"),
    pytest.mark.skipif(not amx(), reason="no AMX tiles here (or SPECGEN_CPU_AMX=0)"),
]


@pytest.fixture
def both():
    """y = x W^T on the tiles and on the vectors (AMX on again afterwards)."""

    def run(x, m, threads=1):
        torch.set_num_threads(threads)
        try:
            amx(True)
            on = packed_linear_cpu(x, m, act="q8")
            amx(False)
            off = packed_linear_cpu(x, m, act="q8")
        finally:
            amx(True)
        return on, off

    return run


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K", "int4-g32", "int4-g64", "int4-g256"])
@pytest.mark.parametrize("rows", [15, 16, 17, 31, 48, 70])
def test_the_tiles_give_the_vector_kernels_bits(both, kind, rows):
    k = 544 if kind in ("Q4_0", "Q4_1", "int4-g32") else 512  # 17 blocks where it can
    if kind.startswith("int"):
        w = torch.randn(45, k, generator=torch.Generator().manual_seed(rows))
        m = quantize(w, 4, int(kind.split("-g")[1]))
    else:
        m = packed_from_blocks(kind, random_blocks(kind, 45, k, np.random.default_rng(rows)),
                               45, k)  # fmt: skip
    gen = torch.Generator().manual_seed(100 + rows)
    x = torch.randn(rows, k, generator=gen) * torch.logspace(-3, 2, rows)[:, None]
    x[1] = 0  # a row of zeros; d 0
    x[0, :32] = float("nan") if rows == 17 else 0.0  # a block holding a NaN: d NaN
    on, off = both(x, m)
    assert torch.equal(on.nan_to_num(7.0), off.nan_to_num(7.0))
    assert torch.equal(on, packed_linear_cpu(x, m, act="q8-portable")) or rows == 17
    for threads in (2, 3):  # every thread's columns on its own tiles
        assert torch.equal(both(x, m, threads)[0].nan_to_num(7.0), on.nan_to_num(7.0))


def test_a_rows_result_does_not_depend_on_the_tile_it_shares(both):
    m = quantize(torch.randn(40, 256, generator=torch.Generator().manual_seed(3)), 4, 32)
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(4))
    whole, _ = both(x, m)
    for start, stop in ((0, 16), (5, 37), (24, 40)):
        part = packed_linear_cpu(x[start:stop], m, act="q8")  # other rows beside it
        assert torch.equal(part, whole[start:stop])
    one = torch.cat([packed_linear_cpu(x[i : i + 1], m, act="q8") for i in range(40)])
    assert torch.equal(one, whole)  # a decode step's row (the vector kernel) alike


def test_the_fused_pass_reads_a_prompt_alike_on_tiles_and_vectors(tiny_dirs, tmp_path):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["qwen3"], gguf, LLAMA_MIXES["q4_1"])
    code = (
        "import sys, torch\n"
        "from specgen.api.pipeline import Pipeline\n"
        "pipe = Pipeline.load(sys.argv[1], device='cpu', context=128)\n"
        "ids = pipe.encode('word ' * 40, raw=True)[:48]\n"
        "logits = pipe.model(torch.tensor([ids]), pipe.model.new_cache(128)).logits\n"
        "answer = [t for c in pipe.stream_ids(ids, max_new_tokens=12) for t in c.token_ids]\n"
        "torch.save((logits, answer), sys.argv[2])\n"
    )
    got = {}
    for flag in ("1", "0"):
        out = tmp_path / f"{flag}.pt"
        env = {**os.environ, "SPECGEN_CPU_AMX": flag}
        done = subprocess.run([sys.executable, "-c", code, str(gguf), str(out)], env=env,
                              capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        got[flag] = torch.load(out)
    assert torch.equal(got["1"][0], got["0"][0]) and got["1"][1] == got["0"][1]


def test_the_build_says_it_has_the_tiles():
    assert "amx" in kernel_isa()
