"""Gemma 3 GGUF targets (llama.cpp's `gemma3` architecture), written as its converter writes
them (support/llamacpp_convert.py: `Gemma3Model`'s names, its 1 + w norms, its metadata;
vision tensors left to the mmproj file) and run packed: the file's weights exactly, its
config from its own key/values, greedy answers identical to transformers' on the file's
dequantized weights (fp32 activations), every method identical to AR (fp32 and 8-bit
activations), `--model FILE.gguf` end to end with the file's chat template.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import FULL, SLIDING, SpecConfig
from specgen.models.families import model_args
from specgen.models.formats.gguf.config import own_config
from specgen.models.formats.gguf.reader import GGUFFile
from specgen.models.formats.weights import DenseWeight, LinearWeight
from specgen.models.fused.cpu_pass import FusedPass
from specgen.models.loading import load_gguf_target, read_config
from specgen.models.loading import load_target as load_dense
from support.drafters import save_tiny_dflash
from support.packed import FAMILY_MIXES, write_tiny_gguf
from support.targets import GGUF_GEMMA3, save_tiny_gemma3

FAST = ["--device", "cpu", "--dtype", "float32"]
PROMPTS = ("The quick brown fox", "def add(a, b):\n    return")
runner = CliRunner()


@pytest.fixture(autouse=True)
def fp32_products(monkeypatch):
    """The file's own model: fp32 activations (q8 is another function of the same weights,
    run by the every-method test below)."""
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")


@pytest.fixture(scope="module")
def targets(tiny_gemma3_gguf_shape, tmp_path_factory):
    """The session's GGUF-shaped tiny Gemma 3 (hidden 64), a multimodal tied one (as the 4B
    and up are published), and a 256-wide one so the K-quants are K-quants."""
    mm = tmp_path_factory.mktemp("g3-mm")
    save_tiny_gemma3(mm, seed=6, multimodal=True, tie_word_embeddings=True, **GGUF_GEMMA3)
    wide = tmp_path_factory.mktemp("g3-wide")
    save_tiny_gemma3(wide, seed=7, hidden_size=256, intermediate_size=512, **GGUF_GEMMA3)
    return {"text": tiny_gemma3_gguf_shape, "multimodal": mm, "wide": wide}


def weights(model) -> dict[str, LinearWeight]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LinearWeight)}


def small_tensors(model) -> dict[str, torch.Tensor]:
    matrices = weights(model)
    return {n: p for n, p in model.named_parameters() if n.rpartition(".")[0] not in matrices}


CASES = [("text", "q8_0"), ("text", "q4_1"), ("text", "q5"), ("multimodal", "q4_1"),
         ("wide", "q4_k_m")]  # fmt: skip


@pytest.mark.parametrize(("family", "mix"), CASES)
def test_a_gguf_target_runs_packed_on_its_own_weights(targets, tmp_path, family, mix):
    hf = targets[family]
    oracle_dir = write_tiny_gguf(hf, tmp_path / "t.gguf", FAMILY_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    dense = load_dense(oracle_dir, dtype=torch.float32, device="cpu")
    assert not any(type(m) is DenseWeight for m in packed.modules())
    assert (packed.lm_head is packed.embed) == (family == "multimodal")
    assert packed.resident_bytes < dense.resident_bytes
    if mix == "q4_k_m":
        assert all(k in packed.weights_identity for k in ("Q4_K", "Q5_K", "Q6_K"))
    for name, w in weights(dense).items():
        assert torch.equal(weights(packed)[name].dense(), w.dense()), name
    # the norms: the file's 1 + w as stored; the dense oracle's w + 1 (finish_load): equal
    ours, theirs = small_tensors(packed), small_tensors(dense)
    assert ours.keys() == theirs.keys() and len(ours) == 6 * 6 + 1
    for name, p in ours.items():
        assert torch.equal(p, theirs[name]), name
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    tokens = torch.randint(0, dense.args.vocab_size, (1, 14),
                           generator=torch.Generator().manual_seed(0))  # fmt: skip
    # the fused CPU pass stays off: kernels/cpu/decoder.c computes the Llama-shaped layer
    # (no post-norms, GELU MLP, sliding windows or 1 + w scales), so this is the eager path
    assert FusedPass.of(packed) is None
    runs = {}
    for model in (packed, exact):  # past the window of 4, then a verify block
        cache = model.new_cache(32, steps=8)
        runs[model] = [model(tokens[:, :7], cache).logits, model(tokens[:, 7:], cache).logits]
    for got, want in zip(runs[packed], runs[exact], strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_the_config_comes_from_the_files_metadata(targets, tmp_path):
    """What llama.cpp reads of the file (pattern 6, the local base 10000, the head dim as
    the scale, linear RoPE scaling on the global layers) is the checkpoint's model."""
    for family in ("text", "multimodal", "wide"):
        hf = targets[family]
        write_tiny_gguf(hf, tmp_path / f"{family}.gguf", FAMILY_MIXES["q8_0"])
        cfg = own_config(GGUFFile(tmp_path / f"{family}.gguf"))
        got = model_args(cfg, name="gguf")
        want = model_args(read_config(hf, family), name="hf")
        assert got == replace(want, rms_norm_eps=np.float32(want.rms_norm_eps).item()), family
        g = got.layout
        assert g.layer_types == (SLIDING,) * 5 + (FULL,) and g.sliding_window == 4
        assert (g.global_rope.kind, g.global_rope.factor) == ("linear", 4.0)


def test_the_27b_scale_and_a_file_without_a_window(targets, tmp_path):
    """llama.cpp's two rules the tiny files do not reach: a 62-layer file's scale is
    1/sqrt(hidden / heads) (the 27B's query_pre_attn_scalar 168), and a file without
    `sliding_window` has no sliding layers."""
    import gguf

    from support.llamacpp_convert import write_vocab

    def header(path, layers, window):
        w = gguf.GGUFWriter(str(path), "gemma3")
        w.add_block_count(layers)
        w.add_context_length(128)
        w.add_embedding_length(5376)
        w.add_feed_forward_length(21504)
        w.add_head_count(32)
        w.add_head_count_kv(16)
        w.add_key_length(128)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(1e6)
        if window:
            w.add_sliding_window(window)
        write_vocab(w, targets["text"], 320, {"model_type": "gemma3_text", "eos_token_id": 1})
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.close()

    header(tmp_path / "27b.gguf", 62, 1024)
    big = model_args(own_config(GGUFFile(tmp_path / "27b.gguf")), name="27b")
    assert big.layout.scale == 168**-0.5 and big.layout.layer_types[5::6] == (FULL,) * 10
    header(tmp_path / "global.gguf", 4, None)
    flat = model_args(own_config(GGUFFile(tmp_path / "global.gguf")), name="global")
    assert flat.layout.layer_types == (FULL,) * 4 and flat.layout.scale == 128**-0.5


def test_greedy_answers_are_transformers_on_the_files_weights(targets, tmp_path):
    """transformers' Gemma 3, given the weights the file defines (dequantized, the
    converter's 1 + w undone), answers as the packed file does."""
    from transformers import AutoModelForCausalLM

    for family in ("text", "multimodal"):
        oracle_dir = write_tiny_gguf(targets[family], tmp_path / f"{family}.gguf",
                                     FAMILY_MIXES["q4_1"])  # fmt: skip
        pipe = Pipeline.load(str(tmp_path / f"{family}.gguf"), device="cpu", dtype="float32")
        assert "packed" in pipe.model.weights_identity
        hf = AutoModelForCausalLM.from_pretrained(oracle_dir, dtype=torch.float32).eval()
        for prompt in PROMPTS:
            ids = pipe.encode(prompt, raw=True)
            with torch.no_grad():
                out = hf.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False)
            want = out[0, len(ids) :].tolist()
            want = want[: want.index(2)] if 2 in want else want
            got = pipe.generate(prompt, raw=True, max_new_tokens=24).token_ids
            assert got == want, (family, prompt)


@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_every_method_is_greedy_identical_to_ar_on_a_packed_gemma3(targets, tmp_path, act,
                                                                   monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    write_tiny_gguf(targets["text"], tmp_path / "t.gguf", FAMILY_MIXES["q4_1"])
    ar = Pipeline.load(str(tmp_path / "t.gguf"), device="cpu", dtype="float32")
    drafter = save_tiny_dflash(tmp_path / "d", target_layer_ids=[1, 3])
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, raw=True).token_ids
        for spec in (
            SpecConfig(method="dflash", drafter=str(drafter), verify_policy="full"),
            SpecConfig(method="dflash", drafter=str(drafter)),
            SpecConfig(method="ngram", verify_policy="full"),
            SpecConfig(method="suffix", verify_policy="full"),
        ):
            got = ar.with_spec(spec).generate(prompt, max_new_tokens=24, raw=True)
            assert got.token_ids == want, (spec.method, prompt)


def test_the_cli_runs_the_file_with_its_chat_template(targets, tmp_path):
    """`--model FILE.gguf`: config, tokenizer and Gemma's turn template from the file; the
    chat prompt is the safetensors checkpoint's, token for token."""
    write_tiny_gguf(targets["text"], tmp_path / "t.gguf", FAMILY_MIXES["q8_0"])
    args = ["generate", "The quick brown fox", "--json", "-n", "8", *FAST]
    done = runner.invoke(app, [*args, "--model", str(tmp_path / "t.gguf")])
    assert done.exit_code == 0, done.stderr
    from_file = Pipeline.load(str(tmp_path / "t.gguf"), device="cpu", dtype="float32")
    from_dir = Pipeline.load(str(targets["text"]), device="cpu", dtype="float32")
    chat = [{"role": "user", "content": "The quick brown fox"}]
    assert from_file.encode(chat) == from_dir.encode(chat)
    assert "<start_of_turn>model\n" in from_file.codec.decode(from_file.encode(chat),
                                                              skip_special=False)  # fmt: skip
    assert json.loads(done.stdout)["stats"]["prompt_tokens"] == len(from_file.encode(chat))


def test_dequantize_runs_the_files_matrices_dense(targets, tmp_path):
    """`--dequantize`: the file's matrices dequantized in memory, its 1 + w norms as they
    are (not added twice): the same logits as the packed model's, up to fp32 summation."""
    write_tiny_gguf(targets["text"], tmp_path / "t.gguf", FAMILY_MIXES["q4_1"])
    packed = load_gguf_target(tmp_path / "t.gguf", targets["text"], dtype=torch.float32,
                              device="cpu")  # fmt: skip
    dense = load_gguf_target(tmp_path / "t.gguf", targets["text"], dtype=torch.float32,
                             device="cpu", dequantize=True)  # fmt: skip
    assert all(type(m) is DenseWeight for m in weights(dense).values())
    assert torch.equal(dense.layers[0].attn_norm, packed.layers[0].attn_norm)
    tokens = torch.randint(0, 320, (1, 12), generator=torch.Generator().manual_seed(3))
    got = dense(tokens, dense.new_cache(16)).logits
    want = packed(tokens, packed.new_cache(16)).logits
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_a_verify_blocks_rows_are_its_decode_steps_bit_for_bit(targets, tmp_path, act,
                                                               monkeypatch):  # fmt: skip
    """The eager layers (every target the fused pass does not run): a block of rows after a
    prompt gives each row the logits that decoding it alone gives, bits and all. torch's CPU
    attention over a block differed from a row alone by 1e-6-1e-5 on an AMD EPYC, which
    flipped an 8-bit activation and a greedy pick."""
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    write_tiny_gguf(targets["text"], tmp_path / "t.gguf", FAMILY_MIXES["q4_1"])
    model = Pipeline.load(str(tmp_path / "t.gguf"), device="cpu", dtype="float32").model
    ids = torch.randint(
        0, model.args.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0)
    )
    cache = model.new_cache(64)
    model(ids[:, :9], cache)
    steps = torch.cat([model(ids[:, t : t + 1], cache).logits for t in range(9, 48)], 1)
    for rows in (2, 4, 9, 17, 39):
        block = model.new_cache(64)
        model(ids[:, :9], block)
        got = model(ids[:, 9 : 9 + rows], block).logits
        assert torch.equal(got[0], steps[0, :rows]), rows
