"""The fused CPU pass (models/fused/cpu_pass.py, kernels/cpu/decoder.c) on packed targets: the
model it computes (against a float64 oracle, as accurately as the eager layers), rows that
never depend on the rows or threads beside them, and the targets it must leave to the
eager layers."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

import pytest
import torch

from specgen.kernels.packed import cpu_library
from specgen.models.formats.weights import convert_weights
from specgen.models.fused.cpu_pass import FusedPass
from specgen.models.loading import load_gguf_target
from specgen.models.loading import load_target as load_dense
from support.packed import LLAMA_MIXES, write_tiny_gguf

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")


def run(model, tokens, splits, taps=(), fused=True, monkeypatch=None, kv=None):
    """Logits (and taps) of `tokens` fed in pieces of the given sizes, one cache (its keys
    and values kept as `kv`, else as the model keeps them)."""
    monkeypatch.setenv("SPECGEN_CPU_PASS", "fused" if fused else "eager")
    cache = model.new_cache(48, steps=4)
    if kv is not None and cache.k.dtype != kv:
        cache = model.family.new_cache(model.args, batch=1, capacity=48, steps=4, dtype=kv,
                                       device=model.device)  # fmt: skip
    logits, tapped, at = [], {i: [] for i in taps}, 0
    for n in splits:
        out = model(tokens[:, at : at + n], cache, taps=taps)
        logits.append(out.logits)
        for i in taps:
            tapped[i].append(out.taps[i])
        at += n
    return torch.cat(logits, 1), {i: torch.cat(t, 1) for i, t in tapped.items()}


@pytest.fixture(scope="module")
def narrow_llama(tmp_path_factory):
    """Heads narrower than the model (2 x 16 < 64): the attention output's rows are not
    the hidden size's."""
    from support.targets import save_tiny

    path = tmp_path_factory.mktemp("narrow-llama")
    save_tiny(path, "llama", seed=6, num_attention_heads=2, num_key_value_heads=1)
    return path


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "wide", "narrow"])
@pytest.mark.parametrize("mix", list(LLAMA_MIXES))
def test_the_fused_pass_computes_the_files_model(tiny_dirs, wide_qwen2, narrow_llama, tmp_path,
                                                 family, mix, monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # the file's model itself (q8: below)
    monkeypatch.setenv("SPECGEN_CPU_KV", "f32")  # its keys and values too (fp16: below)
    hf = {"wide": wide_qwen2, "narrow": narrow_llama}.get(family) or tiny_dirs[family]
    oracle_dir = write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")  # the file's model
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, exact.args.vocab_size, (1, 24), generator=gen)
    splits, taps = (16, 1, 4, 3), (0, 1)
    want, want_taps = run(exact, tokens, splits, taps, fused=False, monkeypatch=monkeypatch)
    got, got_taps = run(packed, tokens, splits, taps, monkeypatch=monkeypatch)
    assert isinstance(FusedPass.of(packed), FusedPass)
    eager, _ = run(packed, tokens, splits, taps, fused=False, monkeypatch=monkeypatch)
    # within fp32 of the exact model, logits and hidden states alike ...
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    for i in taps:
        scale = want_taps[i].abs().max().item()
        torch.testing.assert_close(got_taps[i].double(), want_taps[i], atol=1e-5 * scale, rtol=0)

    # ... and at least as close to it as the eager layers on the same products, position by
    # position (the median: a random tiny model has a position or two so ill-conditioned that
    # any change of fp32 rounding moves its error 10x either way, in either pass)
    def typical(a):
        return (a.double() - want).pow(2).mean(-1).sqrt().median().item()

    assert typical(got) <= 1.5 * typical(eager) + 1e-7


def test_keys_and_values_are_fp16_unless_asked_for_fp32(tiny_dirs, tmp_path, monkeypatch):
    """llama.cpp's default, and faster in every shape measured (docs/design.md)."""
    monkeypatch.delenv("SPECGEN_CPU_KV", raising=False)
    hf = tiny_dirs["llama"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    assert packed.new_cache(8).k.dtype == torch.float16
    monkeypatch.setenv("SPECGEN_CPU_KV", "f32")
    assert packed.new_cache(8).k.dtype == torch.float32
    monkeypatch.setenv("SPECGEN_CPU_KV", "f8")
    with pytest.raises(ValueError, match="SPECGEN_CPU_KV='f8': use one of f16, f32"):
        packed.new_cache(8)


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
@pytest.mark.parametrize("kv", ["f32", "f16"])
def test_a_rows_result_never_depends_on_the_rows_or_threads_beside_it(
    tiny_qwen3_deep, tmp_path, mix, act, kv, monkeypatch
):
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    monkeypatch.setenv("SPECGEN_CPU_KV", kv)  # f16: widened as read, tile by tile
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    model = load_gguf_target(
        tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu"
    )
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, model.args.vocab_size, (1, 30), generator=gen)
    taps = tuple(range(model.args.num_layers))
    one_by_one, one_taps = run(model, tokens, (5,) + (1,) * 25, taps, monkeypatch=monkeypatch)
    # verify blocks on both sides of the kernels' direct path (up to 16 rows), a prefill
    for splits in ((5, 4, 17, 4), (5, 16, 9), (30,)):
        got, got_taps = run(model, tokens, splits, taps, monkeypatch=monkeypatch)
        assert torch.equal(got[:, 5:], one_by_one[:, 5:]), splits
        for i in taps:
            assert torch.equal(got_taps[i][:, 5:], one_taps[i][:, 5:]), (splits, i)
    FusedPass.of(model).min_parallel_work = 0  # share even a tiny model's phases
    FusedPass.of(model).tuner = None  # every call with exactly n threads
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            assert torch.equal(run(model, tokens, (5, 4, 17, 4), monkeypatch=monkeypatch)[0], got)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m", "q5", "q8_0"])
def test_scales_laid_out_by_panel_give_the_bits_of_scales_transposed_per_call(
    tiny_qwen3_deep, tmp_path, mix, monkeypatch
):
    """With 8-bit activations the pass hands the kernels each weight's scales panel by panel
    (made once at load); the kernels then read them instead of transposing the file's
    layout on every call. The same values, so the same bits, whatever the row count."""
    monkeypatch.setenv("SPECGEN_CPU_ACT", "q8")
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    model = load_gguf_target(
        tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu"
    )
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, model.args.vocab_size, (1, 30), generator=gen)
    splits = (5, 1, 8, 16)
    with_panels, _ = run(model, tokens, splits, monkeypatch=monkeypatch)
    fused = FusedPass.of(model)
    lins = [getattr(layer, n) for layer in fused.model.layer[: fused.layer_count]
            for n in ("qkv", "o", "gate_up", "down")] + [fused.model.head]  # fmt: skip
    segs = [lin.segs[j] for lin in lins for j in range(lin.nsegs)]
    assert any(seg.panels.width for seg in segs)  # the pass made them
    for seg in segs:
        seg.panels.width = 0  # the kernels transpose the file's layout again
    without, _ = run(model, tokens, splits, monkeypatch=monkeypatch)
    assert torch.equal(with_panels, without)


def test_the_pass_keeps_token_embeddings_that_are_the_models_own(
    tiny_qwen3_deep, tmp_path, monkeypatch
):
    """Decode steps and verify blocks read their tokens' embeddings from a cache the pass
    fills from `embed_tokens` (a lookup through the packed matrix was 2-3% of a step): the
    same bits, repeats and all, and a full cache starts over, cached tokens of the block
    that overflowed it included (they were once looked up after the cache was emptied: a
    KeyError after ~1,800 answers of `specgen train --prompts`)."""
    from specgen.models.fused import cpu_pass

    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    model = load_gguf_target(
        tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu"
    )
    fused = FusedPass.of(model)
    fused._rows_limit = 6
    for ids in ([3], [5, 3, 5, 9], [1, 2, 4, 6, 7], [1, 20, 21], [3], list(range(40))):
        got = fused.embed(model, ids)
        assert got.shape == (1, len(ids), model.args.hidden_size) and got.is_contiguous()
        assert torch.equal(got, model.embed_tokens(torch.tensor([ids])))
        assert len(fused._rows) <= 6
    assert len(ids) > cpu_pass.EMBED_CACHED_ROWS and 39 not in fused._rows  # not a prefill's


@pytest.mark.parametrize("family", ["llama", "qwen3", "narrow"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_with_keys_and_values_in_fp16_the_pass_computes_the_eager_layers_model(
    tiny_dirs, narrow_llama, tmp_path, family, act, monkeypatch
):
    """With SPECGEN_CPU_KV=f16 a target the pass runs keeps its keys and values as fp16
    (cpu_pass.kv_dtype, as llama.cpp does), in its own cache whichever pass runs a step:
    the fused pass and the eager layers then compute the same model (both round the same
    fp32 keys and values), and it is the file's model with its keys and values so kept,
    position by position as near as the eager layers are. (Against the float64 model
    rounded so, a key computed in fp32 now and then rounds to the other half of a tie: the
    median position is the measure.)"""
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    monkeypatch.setenv("SPECGEN_CPU_KV", "f16")
    hf = {"narrow": narrow_llama}.get(family) or tiny_dirs[family]
    oracle_dir = write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    assert packed.new_cache(8).k.dtype == torch.float16
    assert exact.new_cache(8).k.dtype == torch.float64  # not a target the pass runs
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, exact.args.vocab_size, (1, 24), generator=gen)
    splits = (16, 1, 4, 3)
    want, _ = run(exact, tokens, splits, fused=False, monkeypatch=monkeypatch, kv=torch.float16)
    got, _ = run(packed, tokens, splits, monkeypatch=monkeypatch)
    eager, _ = run(packed, tokens, splits, fused=False, monkeypatch=monkeypatch)

    def typical(a):
        return (a.double() - want).pow(2).mean(-1).sqrt().median().item()

    def rms(a, b):
        return (a.double() - b.double()).pow(2).mean().sqrt().item()

    scale = want.pow(2).mean().sqrt().item()
    # measured on these models: fused against eager 2e-7 (q8) to 9e-5 (fp32) of the scale
    assert rms(got, eager) < 1e-3 * scale
    if act == "fp32":  # the file's model so kept: 1e-6 to 1.4e-5 of the scale
        assert rms(got, want) < 1e-4 * scale
        assert typical(got) <= 1.5 * typical(eager) + 1e-7
    else:  # 8-bit rows are a change of function of their own (the test below)
        assert rms(got, want) < 0.1 * scale


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m", "q5"])
def test_with_8_bit_activations_the_pass_computes_the_eager_layers_model(
    wide_qwen2, tmp_path, mix, monkeypatch
):
    """SPECGEN_CPU_ACT=q8 changes the function (each product's input rows rounded to 8 bits):
    the fused pass and the eager layers compute the same one (their products are the same
    kernel; norms, RoPE and attention differ by fp32 rounding, which can move an input across
    a rounding step now and then), much nearer each other than either is to the file's
    model, which is itself within what 8-bit rows cost."""
    oracle_dir = write_tiny_gguf(wide_qwen2, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", wide_qwen2, dtype=torch.float32, device="cpu")
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, exact.args.vocab_size, (1, 24), generator=gen)
    splits = (16, 1, 4, 3)
    want, _ = run(exact, tokens, splits, fused=False, monkeypatch=monkeypatch)
    monkeypatch.setenv("SPECGEN_CPU_ACT", "q8")
    got, _ = run(packed, tokens, splits, monkeypatch=monkeypatch)
    assert FusedPass.of(packed).model.act == 1  # the pass, told to quantize
    eager, _ = run(packed, tokens, splits, fused=False, monkeypatch=monkeypatch)

    def rms(a, b):
        return (a.double() - b.double()).pow(2).mean().sqrt().item()

    scale = want.pow(2).mean().sqrt().item()
    assert rms(got, want) < 0.1 * scale  # 8-bit rows: 2-5% on these random tiny models
    assert rms(got, eager) < 0.25 * rms(got, want)  # measured: 0.06 at most


def test_targets_it_cannot_run_go_through_the_eager_layers(tiny_dirs, tmp_path, monkeypatch):
    hf = tiny_dirs["qwen3"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    dense = load_dense(hf, dtype=torch.float32, device="cpu")
    assert FusedPass.of(packed) is not None
    assert FusedPass.of(dense) is None  # dense matrices: torch's own products
    half = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.bfloat16, device="cpu")
    assert FusedPass.of(half) is None
    monkeypatch.setenv("SPECGEN_CPU_PASS", "eager")
    assert FusedPass.of(packed) is None
    monkeypatch.delenv("SPECGEN_CPU_PASS")
    assert FusedPass.of(packed) is not None
    # a batch of two: the eager layers, whose rows are each row alone (eager, and fused
    # up to fp32 rounding)
    tokens = torch.randint(0, 320, (2, 7), generator=torch.Generator().manual_seed(2))
    batch = packed(tokens, packed.new_cache(16, batch=2)).logits
    for r in range(2):
        fused = packed(tokens[r : r + 1], packed.new_cache(16)).logits
        monkeypatch.setenv("SPECGEN_CPU_PASS", "eager")
        eager = packed(tokens[r : r + 1], packed.new_cache(16)).logits
        monkeypatch.delenv("SPECGEN_CPU_PASS")
        torch.testing.assert_close(batch[r : r + 1], eager, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(fused, eager, atol=1e-4, rtol=1e-4)


def test_the_pass_runs_only_the_options_it_names(tiny_dirs, tmp_path, monkeypatch):
    """An allow-list: every ModelArgs field is named in OPTIONS, an option the pass does
    not compute keeps the model off it, and so does any field nobody named (a new option,
    a new family's) and a family that does not declare `fused_cpu`."""
    import dataclasses

    from specgen.core.config import ModelArgs
    from specgen.models.family import family_of
    from specgen.models.fused import cpu_pass

    assert {f.name for f in dataclasses.fields(ModelArgs)} == set(cpu_pass.OPTIONS)
    hf = tiny_dirs["qwen3"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    args = packed.args
    assert cpu_pass.runnable(packed)
    for change in (dict(norm_offset=True), dict(logit_softcap=30.0), dict(rotary_dim=2),
                   dict(attn_output_gate=True), dict(embed_scale=8.0)):  # fmt: skip
        assert not cpu_pass.options_runnable(dataclasses.replace(args, **change)), change
    unnamed = {k: v for k, v in cpu_pass.OPTIONS.items() if k != "qk_norm"}
    monkeypatch.setattr(cpu_pass, "OPTIONS", unnamed)
    assert not cpu_pass.runnable(packed)
    monkeypatch.setattr(cpu_pass, "OPTIONS", {**unnamed, "qk_norm": cpu_pass._any})
    monkeypatch.setattr(type(family_of(args)), "fused_cpu", False)
    assert not cpu_pass.runnable(packed)


def test_the_pass_follows_weights_that_change(tiny_dirs, monkeypatch):
    hf = tiny_dirs["llama"]
    model = load_dense(hf, dtype=torch.float32, device="cpu")
    tokens = torch.tensor([[3, 14, 15, 92]])
    dense_logits = model(tokens, model.new_cache(8)).logits
    convert_weights(model, "int8")  # dense -> packed: now it runs fused
    first = FusedPass.of(model)
    assert first is not None
    int8 = model(tokens, model.new_cache(8)).logits
    assert (int8 - dense_logits).abs().max() > 0
    convert_weights(model, "int4")  # no effect: nothing dense is left, but the count moved
    assert FusedPass.of(model) is not first
    model.float()  # cast: pointers may move
    assert model.__dict__.get("_fused") is None
    torch.testing.assert_close(model(tokens, model.new_cache(8)).logits, int8)


def test_the_context_limit_is_refused_before_anything_is_written(tiny_dirs, tmp_path):
    from specgen.models.cache.kv import ContextLimitError

    hf = tiny_dirs["qwen3"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES["q8_0"])
    model = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    cache = model.new_cache(8)
    model(torch.tensor([[1, 2, 3, 4, 5, 6]]), cache)
    with pytest.raises(ContextLimitError, match="context limit"):
        model(torch.tensor([[7, 8, 9]]), cache)
    assert cache.length == 6
    model(torch.tensor([[7, 8]]), cache)
    assert cache.length == 8


def test_keys_and_values_round_to_fp16_as_torch_does():
    """decoder.c stores keys and values as fp16 rounded to nearest even, in its SIMD path
    (F16C) and its portable one alike, the bits torch's conversion gives (the eager layers
    write the same cache): normal values, ties, subnormal halves, overflow, zeros, inf."""
    from specgen.kernels.decoder_cpu import kv_round

    gen = torch.Generator().manual_seed(5)
    wide = torch.randn(4096, generator=gen) * torch.logspace(-9, 5, 4096).float()
    halves = torch.arange(0, 0x7C00, 7, dtype=torch.int32).to(torch.int16).view(torch.float16)
    ties = halves.float()  # each half, then halfway to its neighbour (a tie), and past it
    nxt = (halves.view(torch.int16) + 1).view(torch.float16).float()
    edges = torch.tensor([0.0, -0.0, 65504.0, 65519.0, 65520.0, 1e9, -1e9, float("inf"),
                          -float("inf"), 2.0**-25, 2.0**-25 * 1.0001, 2.0**-26, 5.96e-8,
                          6.1e-5, 6.104e-5, -3.0e-6])  # fmt: skip
    x = torch.cat([wide, -wide, ties, (ties + nxt) / 2, ties + (nxt - ties) * 0.5001,
                   edges]).contiguous()  # fmt: skip
    want = x.to(torch.float16).view(torch.int16)
    for portable in (0, 1):
        out = torch.empty(x.numel(), dtype=torch.int16)
        kv_round()(x.data_ptr(), out.data_ptr(), x.numel(), portable)
        assert torch.equal(out, want), portable


@pytest.mark.skipif(
    platform.libc_ver()[0] != "glibc" or platform.machine() not in ("x86_64", "AMD64"),
    reason="the gate's e^x is glibc's x86-64 expf, operation for operation",
)
def test_the_gates_exp_is_libms_expf_bit_for_bit():
    """decoder.c's gate takes e^x in 8 lanes as glibc's expf computes it (checked for all
    2^32 inputs when it was written): here half a million, bit patterns at random
    (NaN, inf and subnormals among them), the range the gate meets densely, and the edges
    where libm under- and overflows; 8 lanes at a time and one by one (an odd count)."""
    from specgen.kernels.decoder_cpu import gate_exp

    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.expf.argtypes, libm.expf.restype = [ctypes.c_float], ctypes.c_float
    gen = torch.Generator().manual_seed(11)
    bits = torch.randint(-(2**31), 2**31, (1 << 18,), generator=gen, dtype=torch.int64)
    dense = torch.linspace(-105.0, 90.0, 1 << 18)
    edges = torch.tensor([0.0, -0.0, 88.72, 88.7228, 88.723, -103.28, -103.2789, -103.972,
                          -103.98, -87.3, 1e-30, -1e-30, float("inf"), -float("inf"),
                          float("nan")])  # fmt: skip
    x = torch.cat([bits.to(torch.int32).view(torch.float32), dense, edges]).contiguous()
    x = x[: x.numel() // 8 * 8 + 5]  # the last 5 one by one
    got = torch.empty_like(x)
    gate_exp()(x.data_ptr(), got.data_ptr(), x.numel())
    want = torch.tensor([libm.expf(v) for v in x.tolist()], dtype=torch.float32)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(got), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
