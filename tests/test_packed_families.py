"""Qwen3.5 and Gemma 4 GGUF targets, run packed: tiny checkpoints written in llama.cpp's
layout (support/llamacpp_convert.py: Qwen3.5's 1 + w norms, -exp(A_log), squeezed conv kernels and
value heads reordered from grouped to tiled; Gemma 4's renamed layer scalars and its
`rope_freqs` table), loaded through their own metadata as `--model FILE.gguf` does. Each
holds its dequantized oracle's weights exactly, gives its logits up to fp32 summation, and
every method stays greedy-identical to AR on it.

transformers 5.25 as an extra oracle: it reads a `qwen35` GGUF itself
(`from_pretrained(dir, gguf_file=...)`, dequantized on the CPU), so the packed Qwen3.5's
logits are held to its model too. It cannot load a `gemma4` GGUF: its reader rebuilds the
config with another model's defaults (head dim 256, per-layer input embeddings, its own
layer pattern) and the load stops on mismatched shapes; specgen builds that config itself
(models/formats/gguf/convert.py) and that path is checked against the checkpoint's own config here.
"""

from __future__ import annotations

import json
from dataclasses import replace

import gguf
import numpy as np
import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.core.errors import CheckpointError
from specgen.models.families import model_args
from specgen.models.formats.gguf.convert import ensure_converted
from specgen.models.formats.packed_matrix import PackedMatrix, quantize
from specgen.models.formats.weights import DenseWeight, LinearWeight
from specgen.models.loading import load_gguf_target
from specgen.models.loading import load_target as load_dense
from support.drafters import save_tiny_dflash
from support.llamacpp_convert import Converter, text_config
from support.packed import FAMILY_MIXES, write_tiny_gguf
from support.targets import save_tiny_gemma4, save_tiny_qwen3_5


@pytest.fixture(scope="module")
def targets(tiny_qwen3_5, tiny_gemma4, tmp_path_factory):
    """The session's tiny Qwen3.5 and Gemma 4 (hidden 64), and 256-wide ones, so that the
    K-quants are K-quants: Qwen3.5's `ssm_out` then takes Q4_K columns (value heads of 64
    inside a 256-column super-block: its reorder is gathered, not undone in place)."""
    wide_q = tmp_path_factory.mktemp("wide-qwen3_5")
    save_tiny_qwen3_5(wide_q, seed=4, hidden_size=256, intermediate_size=512,
                      linear_value_head_dim=64)  # fmt: skip
    wide_g = tmp_path_factory.mktemp("wide-gemma4")
    save_tiny_gemma4(wide_g, seed=4, hidden_size=256, intermediate_size=512)
    tied_g = tmp_path_factory.mktemp("tied-gemma4")  # as Gemma 4 is published: no output.weight
    save_tiny_gemma4(tied_g, seed=5, tie_word_embeddings=True)
    return {"qwen3_5": tiny_qwen3_5, "gemma4": tiny_gemma4, "wide qwen3_5": wide_q,
            "wide gemma4": wide_g, "tied gemma4": tied_g}  # fmt: skip


@pytest.fixture(autouse=True)
def fp32_products(monkeypatch):
    """The files' own models: fp32 activations (SPECGEN_CPU_ACT=q8 is another function of the
    same weights; its products have test_packed_q8.py, and the methods are run on it below)."""
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")


def weights(model) -> dict[str, LinearWeight]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LinearWeight)}


def small_tensors(model) -> dict[str, torch.Tensor]:
    """Every parameter outside the matrices: norms, conv kernels, decays, layer scalars."""
    matrices = weights(model)
    return {n: p for n, p in model.named_parameters() if n.rpartition(".")[0] not in matrices}


def file_decay(path, hf, layer: int) -> torch.Tensor:
    """Layer `layer`'s `ssm_a` as the file stores it, its heads in HF's order."""
    config = json.loads((hf / "config.json").read_text())
    convert = Converter("qwen3_5", text_config(config), names=None)
    (t,) = (t for t in gguf.GGUFReader(str(path)).tensors if t.name == f"blk.{layer}.ssm_a")
    name = f"model.layers.{layer}.linear_attn.A_log"
    return torch.from_numpy(np.ascontiguousarray(convert.grouped(name, np.array(t.data))))


def logits(model, tokens):
    cache = model.new_cache(32, steps=4)
    return model(tokens[:, :6], cache).logits, model(tokens[:, 6:], cache).logits


CASES = [("qwen3_5", m) for m in ("q8_0", "q4_1", "q5")] + [
    ("gemma4", m) for m in ("q8_0", "q4_1", "q5")
] + [("wide qwen3_5", "q4_k_m"), ("wide gemma4", "q4_k_m"), ("tied gemma4", "q4_1")]  # fmt: skip


@pytest.mark.parametrize(("family", "mix"), CASES)
def test_a_gguf_target_runs_packed_on_its_own_weights(targets, tmp_path, family, mix, monkeypatch):
    hf = targets[family]
    oracle_dir = write_tiny_gguf(hf, tmp_path / "t.gguf", FAMILY_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    dense = load_dense(oracle_dir, dtype=torch.float32, device="cpu")
    assert not any(type(m) is DenseWeight for m in packed.modules())
    assert (packed.lm_head is packed.embed) == (dense.lm_head is dense.embed) == ("tied" in family)
    assert packed.resident_bytes < dense.resident_bytes
    if mix == "q4_k_m":  # the K-quants themselves, not their fallbacks
        assert all(k in packed.weights_identity for k in ("Q4_K", "Q5_K", "Q6_K"))
    if "qwen3_5" in family:  # the value-head reorder of ssm_out crossed its blocks
        (out,) = packed.layers[0].w_out.segments
        assert out.columns is not None and (mix != "q4_k_m" or out.kind == "Q4_K")
    for name, w in weights(dense).items():  # rows and columns back in HF order, nothing lost
        assert torch.equal(weights(packed)[name].dense(), w.dense()), name
    # the small tensors (norms, conv kernels, dt_bias, layer scalars) as the file has them
    ours, theirs = small_tensors(packed), small_tensors(dense)
    assert ours.keys() == theirs.keys() and len(ours) > 20
    for name, p in ours.items():
        if name.endswith(".decay"):  # the file's -exp(A_log) itself, not exp(log) of it
            assert torch.equal(p, file_decay(tmp_path / "t.gguf", hf, int(name.split(".")[1])))
            torch.testing.assert_close(p, theirs[name], rtol=3e-7, atol=0)  # the oracle's
        else:
            assert torch.equal(p, theirs[name]), name
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    tokens = torch.randint(0, dense.args.vocab_size, (1, 9),
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    # the file's model (its dequantized weights in float64) up to fp32; these families take
    # the eager layers anyway (the fused pass is Llama-shaped only)
    monkeypatch.setenv("SPECGEN_CPU_PASS", "eager")
    for got, want in zip(logits(packed, tokens), logits(exact, tokens), strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(("family", "mix"), [("qwen3_5", "q4_1"), ("wide qwen3_5", "q4_k")])
def test_transformers_reads_the_same_qwen3_5_file(targets, tmp_path, family, mix):
    """The extra oracle: transformers' own GGUF reader (module docstring; it has no Q5_0 or
    Q5_1)."""
    from transformers import AutoModelForCausalLM

    hf = targets[family]
    write_tiny_gguf(hf, tmp_path / "t.gguf", FAMILY_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="t.gguf",
                                               dtype=torch.float32).eval()  # fmt: skip
    tokens = torch.randint(0, packed.args.vocab_size, (1, 12),
                           generator=torch.Generator().manual_seed(1))  # fmt: skip
    with torch.no_grad():
        want = ref(tokens).logits
    got = packed(tokens, packed.new_cache(32)).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_the_config_comes_from_the_files_metadata(targets, tmp_path):
    """`--model FILE.gguf` has no config.json: Qwen3.5's comes from transformers' reader,
    Gemma 4's from specgen's (models/formats/gguf/convert.py). Either describes the model
    the checkpoint's own config does (rms_norm_eps goes through the file's fp32). A Qwen3.5
    file with its multi-token-prediction block (one more `blk.`) is the same model."""
    for family, mtp in (("qwen3_5", 0), ("qwen3_5", 1), ("wide qwen3_5", 0), ("gemma4", 0),
                        ("tied gemma4", 0)):  # fmt: skip
        hf = targets[family]
        path = tmp_path / f"{family}-{mtp}.gguf"
        oracle = write_tiny_gguf(hf, path, FAMILY_MIXES["q8_0"], mtp=mtp)
        converted = ensure_converted(path)
        if mtp:  # the extra block is never read
            packed = load_gguf_target(path, converted, dtype=torch.float32, device="cpu")
            dense = load_dense(oracle, dtype=torch.float32, device="cpu")
            for name, w in weights(dense).items():
                assert torch.equal(weights(packed)[name].dense(), w.dense()), name
        got = model_args(json.loads((converted / "config.json").read_text()), name="gguf")
        want = model_args(json.loads((hf / "config.json").read_text()), name="hf")
        eps = np.float32(want.rms_norm_eps).item()
        assert got == replace(want, rms_norm_eps=eps), family


def test_dequantize_runs_the_files_matrices_dense(targets, tmp_path):
    """`--dequantize`: transformers cannot dequantize these files, so the packed load is
    dequantized in memory, to the oracle's weights exactly."""
    from specgen.api.loader import load_target

    for family in ("qwen3_5", "gemma4"):
        oracle = write_tiny_gguf(targets[family], tmp_path / f"{family}.gguf", FAMILY_MIXES["q4_1"])
        got = load_target(str(tmp_path / f"{family}.gguf"), device="cpu", dtype="float32",
                          dequantize=True).model  # fmt: skip
        dense = load_dense(oracle, dtype=torch.float32, device="cpu")
        assert got.weights_identity == dense.weights_identity == "dense-float32"
        assert (got.lm_head is got.embed) == (dense.lm_head is dense.embed)
        for name, w in weights(dense).items():
            assert torch.equal(weights(got)[name].dense(), w.dense()), (family, name)


def _pipelines(gguf_path, dense_dir):
    packed = Pipeline.load(str(gguf_path), device="cpu", dtype="float32")
    dense = Pipeline.load(str(dense_dir), device="cpu", dtype="float32")
    assert "packed" in packed.model.weights_identity
    return packed, dense


PROMPTS = ("The quick brown fox", "def add(a, b):\n    return")


@pytest.mark.integration  # every method's pipeline on one target
@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_every_method_is_greedy_identical_to_ar_on_a_packed_qwen3_5(targets, tmp_path, mix, act,
                                                                     monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    family = "wide qwen3_5" if mix == "q4_k_m" else "qwen3_5"
    hidden = 256 if mix == "q4_k_m" else 64
    oracle = write_tiny_gguf(targets[family], tmp_path / "t.gguf", FAMILY_MIXES[mix])
    ar, dense = _pipelines(tmp_path / "t.gguf", oracle)
    drafter = save_tiny_dflash(tmp_path / "d", hidden=hidden, target_layer_ids=[1, 3])
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, raw=True).token_ids
        # the packed file's model is the oracle's: one greedy answer (with fp32 activations)
        if act == "fp32":
            assert dense.generate(prompt, max_new_tokens=24, raw=True).token_ids == want, prompt
        for spec in (
            SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full"),
            SpecConfig(method="dflash", drafter=str(drafter)),  # scheduled verify lengths
            SpecConfig(method="ngram", verify_policy="full"),
        ):
            got = ar.with_spec(spec).generate(prompt, max_new_tokens=24, raw=True)
            assert got.token_ids == want, (spec.method, prompt)


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_every_method_is_greedy_identical_to_ar_on_a_packed_gemma4(targets, tmp_path, mix, act,
                                                                   monkeypatch):  # fmt: skip
    from support.gemma4_drafters import save_zlab_gemma_drafter

    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    family = "wide gemma4" if mix == "q4_k_m" else "gemma4"
    oracle = write_tiny_gguf(targets[family], tmp_path / "t.gguf", FAMILY_MIXES[mix])
    ar, dense = _pipelines(tmp_path / "t.gguf", oracle)
    drafter = save_zlab_gemma_drafter(tmp_path / "d", targets[family], multiplier=0.5)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, raw=True).token_ids
        if act == "fp32":
            assert dense.generate(prompt, max_new_tokens=24, raw=True).token_ids == want, prompt
        for spec in (
            SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full"),
            SpecConfig(method="dflash", drafter=str(drafter)),
            SpecConfig(method="ngram", verify_policy="full"),
        ):
            got = ar.with_spec(spec).generate(prompt, max_new_tokens=24, raw=True)
            assert got.token_ids == want, (spec.method, prompt)


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["wide qwen3_5", "wide gemma4"])
def test_on_cuda_a_packed_target_gives_the_files_logits_and_greedy_answers(targets, tmp_path,
                                                                            family):  # fmt: skip
    """The Triton kernel, Qwen3.5's ssm_out read with its input gathered: the file's model
    (float64, on the CPU) up to fp32, and DFlash and ngram greedy-identical to AR."""
    hf = targets[family]
    oracle = write_tiny_gguf(hf, tmp_path / "t.gguf", FAMILY_MIXES["q4_k_m"])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cuda")
    exact = load_dense(oracle, dtype=torch.float64, device="cpu")
    tokens = torch.randint(0, exact.args.vocab_size, (1, 9),
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    for got, want in zip(logits(packed, tokens.cuda()), logits(exact, tokens), strict=True):
        torch.testing.assert_close(got.double().cpu(), want, atol=1e-4, rtol=1e-4)
    ar = Pipeline.load(str(tmp_path / "t.gguf"), device="cuda", dtype="float32")
    drafter = save_tiny_dflash(tmp_path / "d", hidden=256, target_layer_ids=[1, 3])
    if "gemma4" in family:
        from support.gemma4_drafters import save_zlab_gemma_drafter

        drafter = save_zlab_gemma_drafter(tmp_path / "g", hf, multiplier=0.5)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, raw=True).token_ids
        for spec in (SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full"),
                     SpecConfig(method="ngram", verify_policy="full")):  # fmt: skip
            got = ar.with_spec(spec).generate(prompt, max_new_tokens=24, raw=True)
            assert got.token_ids == want, (spec.method, prompt)


def _rewrite(src, dst, arch: str, *, drop: str = "", reshape: str = "") -> None:
    """`src` with tensor `drop` left out, or `reshape` written as a 64x64 Q8_0 matrix."""
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(dst), arch)
    for t in reader.tensors:
        if t.name == drop:
            continue
        if t.name == reshape:
            q8 = gguf.GGMLQuantizationType.Q8_0
            writer.add_tensor(t.name, gguf.quants.quantize(np.ones((64, 64), np.float32), q8),
                              raw_dtype=q8)  # fmt: skip
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


BAD = [
    ("qwen3_5", "qwen35", dict(drop="blk.1.ssm_dt.bias"),
     r"lacks blk\.1\.ssm_dt\.bias \(model\.layers\.1\.linear_attn\.dt_bias\)"),
    ("qwen3_5", "qwen35", dict(drop="blk.0.ssm_a"),
     r"lacks blk\.0\.ssm_a \(model\.layers\.0\.linear_attn\.A_log\)"),
    ("qwen3_5", "qwen35", dict(reshape="blk.0.ssm_out.weight"),
     r"tensor blk\.0\.ssm_out\.weight \(model\.layers\.0\.linear_attn\.out_proj\.weight\) "
     r"has shape \(64, 64\), expected \(64, 32\)"),
    ("gemma4", "gemma4", dict(drop="blk.3.layer_output_scale.weight"), None),
    ("gemma4", "gemma4", dict(drop="blk.2.attn_k_norm.weight"),
     r"lacks blk\.2\.attn_k_norm\.weight \(model\.layers\.2\.self_attn\.k_norm\.weight\)"),
    ("gemma4", "gemma4", dict(reshape="blk.2.attn_q.weight"),
     r"tensor blk\.2\.attn_q\.weight \(model\.layers\.2\.self_attn\.q_proj\.weight\) "
     r"has shape \(64, 64\), expected \(128, 64\)"),
]  # fmt: skip


@pytest.mark.parametrize(("family", "arch", "edit", "message"), BAD)
def test_a_broken_file_names_the_tensor_in_one_line(targets, tmp_path, family, arch, edit,
                                                     message):  # fmt: skip
    hf = targets[family]
    write_tiny_gguf(hf, tmp_path / "t.gguf", FAMILY_MIXES["q8_0"])
    _rewrite(tmp_path / "t.gguf", tmp_path / "bad.gguf", arch, **edit)
    load = lambda: load_gguf_target(tmp_path / "bad.gguf", hf, dtype=torch.float32,  # noqa: E731
                                    device="cpu", name="bad.gguf")  # fmt: skip
    if message is None:  # an optional tensor: the layer scalar keeps transformers' ones
        model = load()
        assert torch.equal(model.layers[3].layer_scalar, torch.ones(1))
        return
    with pytest.raises(CheckpointError, match=message) as e:
        load()
    assert str(e.value).startswith("bad.gguf: ") and "\n" not in str(e.value)


def test_a_packed_matrix_multiplies_its_stored_columns_in_their_input_order():
    """`PackedMatrix.permute_columns` (Qwen3.5's ssm_out): the blocks stay as they are, the
    product and the dequantized matrix are the reordered matrix's."""
    w = torch.randn(24, 64, generator=torch.Generator().manual_seed(0))
    for bits in (4, 8):
        m = quantize(w, bits, 32)
        order = torch.randperm(64, generator=torch.Generator().manual_seed(bits))
        moved = m.permute_columns(order)
        assert torch.equal(moved.q, m.q)  # nothing unpacked or moved
        assert torch.equal(moved.dequantize(), m.dequantize()[:, order])
        assert torch.equal(moved.permute_columns(torch.argsort(order)).dequantize(), m.dequantize())
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
        torch.testing.assert_close(moved(x), x @ moved.dequantize().T, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(moved(x), x[:, torch.argsort(order)] @ m.dequantize().T,
                                   atol=1e-5, rtol=1e-5)  # fmt: skip
        assert torch.equal(moved.narrow_rows(2, 9).dequantize(), moved.dequantize()[2:9])
        assert moved.stacks_with(moved) and not moved.stacks_with(m)
        assert isinstance(moved, PackedMatrix)
