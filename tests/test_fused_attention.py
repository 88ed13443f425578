"""The fused CPU pass's attention over contexts of many tiles (kernels/cpu/decoder.c,
`attend_run`): the queries that share a KV head go through its keys and values a tile at a
time, two queries at once where the build has 32 vector registers. Heads of 128 make a
tile 32 keys (fp32) or 64 (fp16), so 150 positions cross several; three query heads per
KV head make pairs that straddle two rows of different lengths, and runs of 24 queries
split long blocks. Whatever the tiling, a row's result is its decode step's, bit for bit,
and the model is the file's."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels.packed import cpu_library
from specgen.models.fused.cpu_pass import FusedPass
from specgen.models.loading import load_gguf_target
from specgen.models.loading import load_target as load_dense
from support.packed import LLAMA_MIXES, write_tiny_gguf

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")

POSITIONS = 150


@pytest.fixture(scope="module")
def wide_heads(tmp_path_factory):
    """Qwen2 with three 128-wide query heads on one KV head."""
    from support.targets import save_tiny

    path = tmp_path_factory.mktemp("wide-heads")
    save_tiny(path, "qwen2", seed=7, hidden_size=384, intermediate_size=256,
              num_attention_heads=3, num_key_value_heads=1)  # fmt: skip
    return path


def run(model, tokens, splits, monkeypatch, fused=True):
    monkeypatch.setenv("SPECGEN_CPU_PASS", "fused" if fused else "eager")
    cache = model.new_cache(POSITIONS + 8, steps=4)
    logits, at = [], 0
    for n in splits:
        logits.append(model(tokens[:, at : at + n], cache).logits)
        at += n
    assert at == tokens.shape[1]
    return torch.cat(logits, 1)


@pytest.fixture
def tokens():
    return torch.randint(0, 200, (1, POSITIONS), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_rows_over_many_tiles_are_their_decode_steps(wide_heads, tmp_path, tokens, kv,
                                                      monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", "q8")
    monkeypatch.setenv("SPECGEN_CPU_KV", kv)
    write_tiny_gguf(wide_heads, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    model = load_gguf_target(tmp_path / "t.gguf", wide_heads, dtype=torch.float32, device="cpu")
    steps = run(model, tokens, (40,) + (1,) * (POSITIONS - 40), monkeypatch)
    # odd blocks (pairs that end on a lone query), a block of 33 rows (99 queries: runs of
    # 24), one row, and a whole prefill
    for splits in ((40, 7, 33, 1, 69), (40, 110), (POSITIONS,)):
        got = run(model, tokens, splits, monkeypatch)
        assert torch.equal(got[:, 40:], steps[:, 40:]), splits
    fused = FusedPass.of(model)
    fused.min_parallel_work, fused.tuner = 0, None  # every call with exactly n threads
    threads = torch.get_num_threads()
    try:  # the threads split the queries anywhere: inside a run, inside a pair
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(run(model, tokens, (40, 7, 33, 1, 69), monkeypatch), got)
    finally:
        torch.set_num_threads(threads)


def test_attention_over_many_tiles_computes_the_files_model(wide_heads, tmp_path, tokens,
                                                            monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")
    monkeypatch.setenv("SPECGEN_CPU_KV", "f32")
    oracle_dir = write_tiny_gguf(wide_heads, tmp_path / "t.gguf", LLAMA_MIXES["q8_0"])
    packed = load_gguf_target(tmp_path / "t.gguf", wide_heads, dtype=torch.float32, device="cpu")
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    splits = (40, 7, 33, 1, 69)
    want = run(exact, tokens, splits, monkeypatch, fused=False)
    got = run(packed, tokens, splits, monkeypatch)
    assert isinstance(FusedPass.of(packed), FusedPass)
    eager = run(packed, tokens, splits, monkeypatch, fused=False)

    # as close to it as torch's fp32 attention on the same products: at worst (a random
    # tiny model has a position or two so ill-conditioned that either is 1e-5 of the largest
    # logit off there), and position by position (the median: see test_fused_cpu.py)
    def worst(a):
        return (a.double() - want).abs().max().item()

    def typical(a):
        return (a.double() - want).pow(2).mean(-1).sqrt().median().item()

    assert worst(got) <= 2 * worst(eager) + 1e-6
    assert typical(got) <= 1.5 * typical(eager) + 1e-7
