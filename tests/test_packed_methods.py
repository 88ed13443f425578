"""Tiny GGUF targets in llama.cpp's layout, run packed: the same weights as their dequantized
oracle, the same logits up to fp32 summation, and every method greedy-identical to AR with
packed weights. Also `--quantize int4|int8` targets, and the bad inputs of both."""

from __future__ import annotations

import pytest
import torch

from specgen.api.loader import Decoding, Target, load_target
from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.core.errors import CheckpointError, OptionError
from specgen.models.formats.weights import DenseWeight, LinearWeight
from specgen.models.loading import load_gguf_target
from specgen.models.loading import load_target as load_dense
from support.packed import LLAMA_MIXES, write_tiny_gguf


def weights(model) -> dict[str, LinearWeight]:
    return {n: m for n, m in model.named_modules() if isinstance(m, LinearWeight)}


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "wide"])
@pytest.mark.parametrize("mix", list(LLAMA_MIXES))
def test_a_gguf_target_runs_packed_on_its_own_weights(tiny_dirs, wide_qwen2, tmp_path, family,
                                                      mix, monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # the file's model itself
    monkeypatch.setenv("SPECGEN_CPU_KV", "f32")  # its keys and values too (test_fused_cpu.py)
    hf = wide_qwen2 if family == "wide" else tiny_dirs[family]
    oracle_dir = write_tiny_gguf(hf, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    packed = load_gguf_target(tmp_path / "t.gguf", hf, dtype=torch.float32, device="cpu")
    dense = load_dense(oracle_dir, dtype=torch.float32, device="cpu")
    assert not any(type(m) is DenseWeight for m in packed.modules())
    if family == "wide" and mix == "q4_k_m":  # the K-quants themselves, not their fallbacks
        assert all(k in packed.weights_identity for k in ("Q4_K", "Q5_K", "Q6_K"))
    assert (packed.lm_head is packed.embed) == (dense.lm_head is dense.embed)
    assert packed.resident_bytes < dense.resident_bytes
    for name, w in weights(dense).items():  # the q/k rows back in HF order, nothing lost
        assert torch.equal(weights(packed)[name].dense(), w.dense()), name
    tokens = torch.randint(
        0, dense.args.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0)
    )
    # the logits of the file's model (its dequantized weights in float64) up to fp32: the
    # eager layers here, so this checks the weights and products (the fused pass is held to
    # the same model in test_fused_cpu.py). Against the fp32 dense model instead, two fp32
    # roundings of it meet by luck: transformers 5.25's seeded weights broke 2e-5 there.
    monkeypatch.setenv("SPECGEN_CPU_PASS", "eager")
    exact = load_dense(oracle_dir, dtype=torch.float64, device="cpu")
    outs = []
    for model in (packed, exact):
        cache = model.new_cache(32, steps=4)
        outs.append((model(tokens[:, :6], cache).logits, model(tokens[:, 6:], cache).logits))
    for got, want in zip(outs[0], outs[1], strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def packed_pipeline(hf_dir, gguf_path) -> Pipeline:
    base = Pipeline.load(str(hf_dir), device="cpu", dtype="float32")
    model = load_gguf_target(gguf_path, hf_dir, dtype=torch.float32, device="cpu")
    return Pipeline._of(Target(model, base.codec, "tiny-gguf", base.context, "test"),
                        Decoding(SpecConfig()))  # fmt: skip


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_every_method_is_greedy_identical_to_ar_with_packed_weights(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, tiny_dflash2, tmp_path, mix, act, monkeypatch
):
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)  # 8-bit activations: verify rows are steps too
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    ar = packed_pipeline(tiny_qwen3_deep, tmp_path / "t.gguf")
    assert "packed" in ar.model.weights_identity
    for prompt in ("packed weights", "a second prompt, longer than the first one"):
        want = ar.generate(prompt, max_new_tokens=32, raw=True).token_ids
        for spec in (
            SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full"),
            SpecConfig(method="dspark", drafter=str(tiny_dspark), verify_policy="full"),
            SpecConfig(method="dflash", drafter=str(tiny_dflash)),  # scheduled verify lengths
            SpecConfig(method="dflash2", drafter=str(tiny_dflash2), verify_policy="full"),
            SpecConfig(method="ngram"),
            SpecConfig(method="suffix"),
        ):
            got = ar.with_spec(spec).generate(prompt, max_new_tokens=32, raw=True)
            assert got.token_ids == want, (spec.method, prompt)


@pytest.mark.parametrize("bits", ["int8", "int4"])
def test_quantize_on_load_packs_every_matrix(tiny_qwen3_deep, tiny_dflash, bits):
    dense = load_target(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    packed = load_target(str(tiny_qwen3_deep), device="cpu", dtype="float32", quantize=bits)
    assert packed.model.weights_identity == f"packed-{bits}-g32"
    assert packed.model.resident_bytes < dense.model.resident_bytes / (2 if bits == "int8" else 4)
    for name, w in weights(dense.model).items():
        err = (weights(packed.model)[name].dense() - w.dense()).abs().max().item()
        assert 0 < err <= w.dense().abs().max().item() / (100 if bits == "int8" else 10)
    ar = Pipeline._of(packed, Decoding(SpecConfig()))
    want = ar.generate("quantized", max_new_tokens=24, raw=True).token_ids
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full")
    assert ar.with_spec(spec).generate("quantized", max_new_tokens=24, raw=True).token_ids == want


def test_quantize_refuses_what_it_cannot_do(tiny_qwen3_deep, tmp_path):
    with pytest.raises(OptionError, match=r"--quantize must be int8 or int4 \(got int3\)"):
        load_target(str(tiny_qwen3_deep), device="cpu", quantize="int3")


def test_an_unsupported_gguf_type_is_named_with_the_supported_ones(tiny_dirs, tmp_path):
    import gguf
    import numpy as np

    from support.packed import qtype

    hf = tiny_dirs["qwen3"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", {"": "Q8_0"})
    # rewrite one matrix as Q2_K: random bytes in its layout
    reader = gguf.GGUFReader(str(tmp_path / "t.gguf"))
    writer = gguf.GGUFWriter(str(tmp_path / "q2.gguf"), "qwen3")
    writer.add_block_count(2)
    for t in reader.tensors:
        if t.name == "blk.0.ffn_up.weight":
            rows, cols = int(t.shape[1]), int(t.shape[0])
            size = gguf.GGML_QUANT_SIZES[qtype("Q2_K")][1]
            data = np.zeros((rows, cols // 256 * size), dtype=np.uint8)
            writer.add_tensor(t.name, data, raw_dtype=qtype("Q2_K"))
        else:
            writer.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(CheckpointError, match=r"blk\.0\.ffn_up\.weight is Q2_K.*supported: .*Q4_K"):
        load_gguf_target(tmp_path / "q2.gguf", hf, dtype=torch.float32, device="cpu")


def test_a_truncated_gguf_fails_in_one_line(tiny_dirs, tmp_path):
    hf = tiny_dirs["qwen3"]
    write_tiny_gguf(hf, tmp_path / "t.gguf", {"": "Q4_0"})
    data = (tmp_path / "t.gguf").read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(CheckpointError, match=r"cut.gguf.*(not a readable GGUF|cannot read)"):
        load_gguf_target(tmp_path / "cut.gguf", hf, dtype=torch.float32, device="cpu",
                         name=str(tmp_path / "cut.gguf"))  # fmt: skip


def test_models_says_how_a_loaded_targets_weights_are_held(tiny_qwen3_deep):
    import json

    from support.cli import assert_one_line_error, run

    got = run("models", str(tiny_qwen3_deep), "--quantize", "int4", "--json")
    assert got.exit_code == 0, got.output
    row = json.loads(got.stdout)
    # 4 bits a weight, and an fp16 scale and minimum per group of 32
    assert row["formats"] == {"packed-int4-g32": 26} and row["matrix_bits_per_weight"] == 5.0
    dense = json.loads(run("models", str(tiny_qwen3_deep), "--json").stdout)
    assert (
        dense["formats"] == {"dense-float32": 26}
        and dense["resident_bytes"] > row["resident_bytes"]
    )
    bad = run("models", str(tiny_qwen3_deep), "--quantize", "int3")
    assert_one_line_error(bad, 2, "--quantize must be int8 or int4 (got int3)")


def test_quantize_on_the_embedded_gguf_is_refused_in_one_line(embedded_gguf):
    from support.cli import assert_one_line_error, run

    got = run("generate", "--quantize", "int8", "--device", "cpu", "hello")
    assert_one_line_error(got, 2, "--quantize is not for smollm2-135m", "already quantized")


def test_a_drafter_trains_against_the_packed_target_it_will_verify_with(tiny_qwen3_deep, tmp_path):
    import json

    from support.cli import FAST, run

    data = tmp_path / "r.jsonl"
    data.write_text(json.dumps({"prompt_ids": [5, 6, 7, 8], "response_ids": list(range(20, 60))}))
    out = tmp_path / "d"
    trained = run("train", "--model", str(tiny_qwen3_deep), "--quantize", "int4", "--kind",
                  "dflash", "--data", str(data), "--out", str(out), "--steps", "2",
                  "--target-layers", "1,3", "--block-size", "4", "--mask-token-id", "319",
                  "--device", "cpu")  # fmt: skip
    assert trained.exit_code == 0, trained.stderr
    args = ("hi", "--model", str(tiny_qwen3_deep), "--quantize", "int4", *FAST, "--json")
    want = json.loads(run("generate", *args, "--method", "ar").stdout)["token_ids"]
    got = run("generate", *args, "--drafter", str(out), "--verify-policy", "full")
    assert got.exit_code == 0, got.stderr
    assert json.loads(got.stdout)["token_ids"] == want


def test_a_drafter_of_another_vocabulary_is_refused_on_a_packed_target(tiny_qwen3_deep, tmp_path):
    from support.cli import assert_one_line_error, run
    from support.drafters import save_tiny_dflash
    from support.targets import TINY_VOCAB

    other = save_tiny_dflash(tmp_path / "d", vocab=TINY_VOCAB + 64, mask_token_id=5,
                             target_layer_ids=[1, 3])  # fmt: skip
    got = run("generate", "hi", "--model", str(tiny_qwen3_deep), "--quantize", "int4",
              "--drafter", str(other), "--device", "cpu")  # fmt: skip
    assert_one_line_error(got, 2, "does not fit target", f"vocabulary {TINY_VOCAB + 64} vs")


@pytest.mark.statistical
def test_sampling_through_dflash_keeps_the_packed_targets_distribution(tiny_qwen3_deep,
                                                                       tiny_dflash):  # fmt: skip
    """The second generated token's empirical distribution converges to the exact one of
    the packed (int4) target, as tests/test_dflash.py checks for a dense one."""
    from support.statistics import second_token_tv

    loaded = load_target(str(tiny_qwen3_deep), device="cpu", dtype="float32", quantize="int4")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash), verify_policy="full")
    dflash = Pipeline._of(loaded, Decoding(SpecConfig())).with_spec(spec)
    tv, far = second_token_tv(dflash, loaded.model)
    assert tv < 0.06 and tv < far / 5, (tv, far)


def test_a_packed_targets_drafters_run_packed_too(tiny_qwen3_deep, tiny_dflash, tmp_path,
                                                  monkeypatch):  # fmt: skip
    """With SPECGEN_DRAFT_WEIGHTS=int8, on a packed CPU target a drafter's matrices are
    packed as int8 (its draft steps then run the target's kernels at a quarter of the
    bytes), its costs keyed apart, and its answers still AR's; by default, and on a dense
    target, they stay as shipped."""
    from specgen.models.formats.weights import weights_identity

    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES["q4_1"])
    ar = packed_pipeline(tiny_qwen3_deep, tmp_path / "t.gguf")
    spec = SpecConfig(method="dflash", drafter=str(tiny_dflash))
    dense = ar.with_spec(spec).method
    assert weights_identity(dense.net) == "dense-float32"
    monkeypatch.setenv("SPECGEN_DRAFT_WEIGHTS", "int8")
    packed_pipe = ar.with_spec(spec)
    assert weights_identity(packed_pipe.method.net) == "packed-int8-g32"
    assert packed_pipe.method.cache_key != dense.cache_key
    want = ar.generate("packed drafts", max_new_tokens=24, raw=True).token_ids
    assert packed_pipe.generate("packed drafts", max_new_tokens=24, raw=True).token_ids == want
    plain = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    assert weights_identity(plain.with_spec(spec).method.net) == "dense-float32"
