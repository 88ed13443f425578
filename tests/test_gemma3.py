"""Gemma 3 targets (safetensors) against transformers' own models, in fp32: logits for a
prefill, decode steps and verify blocks past the sliding window, greedy answers identical to
`generate`, for several attention patterns (every third layer global, every sixth, all
global) and both published layouts (text-only `Gemma3ForCausalLM`, multimodal
`Gemma3ForConditionalGeneration`, vision never read); every method identical to AR on it;
the chat template; what is refused, in one line. The GGUF side is test_gemma3_gguf.py.
"""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import FULL, SLIDING, SpecConfig
from specgen.core.errors import CheckpointError
from specgen.models import loading
from specgen.models.families import model_args
from specgen.models.graphs import GraphedForward
from specgen.models.loading import load_target
from specgen.models.transformer import Transformer
from support.cli import assert_one_line_error
from support.drafters import save_tiny_dflash, save_tiny_dflash2, save_tiny_dspark
from support.targets import GGUF_GEMMA3, TINY_VOCAB, save_tiny_gemma3

TOL = dict(atol=2e-5, rtol=1e-5)  # fp32: the same ops, sums in another order
FAST = ["--device", "cpu", "--dtype", "float32"]
G, S = FULL, SLIDING
VARIANTS = {  # name -> (builder overrides, the layer types they give)
    "pattern-3": ({}, (S, S, G) * 2),
    "pattern-6": (GGUF_GEMMA3, (S,) * 5 + (G,)),
    "all-global": (dict(sliding_window_pattern=1), (G,) * 6),
    "multimodal-tied": (dict(multimodal=True, tie_word_embeddings=True), (S, S, G) * 2),
}
runner = CliRunner()


@pytest.fixture(autouse=True)
def fp32_products(monkeypatch):
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # the oracle's arithmetic


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"g3-{request.param}")
    overrides, types = VARIANTS[request.param]
    hf = save_tiny_gemma3(path, seed=1, **overrides)
    return request.param, path, hf, types, load_target(path, dtype=torch.float32, device="cpu")


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def _reference_in_steps(hf, ids, cuts):
    """transformers' logits for `ids` fed in the same pieces through its own cache."""
    from transformers import DynamicCache

    cache, parts = DynamicCache(config=hf.config), []
    with torch.no_grad():
        for a, b in zip(cuts, cuts[1:], strict=False):
            out = hf(input_ids=ids[:, a:b], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            parts.append(out.logits)
    return torch.cat(parts, dim=1)


def test_the_config_is_read_as_transformers_reads_it(pair):
    variant, _, hf, types, ours = pair
    a, g = ours.args, ours.args.layout
    text = hf.config.get_text_config()
    assert g.layer_types == types == tuple(text.layer_types)
    assert g.sliding_window == 4 and a.embed_scale == 8.0 and a.qk_norm and a.fp32_norms
    assert g.scale == text.query_pre_attn_scalar**-0.5 and a.logit_softcap is None
    rope = text.rope_parameters
    assert g.sliding_rope.theta == rope[S]["rope_theta"] == 10_000.0
    assert (g.global_rope.theta, g.global_rope.kind, g.global_rope.factor) == (
        rope[G]["rope_theta"], "linear", 4.0)  # fmt: skip
    assert (ours.lm_head is ours.embed) == ("tied" in variant)
    assert ours.windows == tuple(4 if t == S else None for t in types)


@pytest.mark.parametrize("prefill", [3, 21])  # inside the window, and far past it
def test_prefill_decode_and_verify_block_match_transformers(pair, prefill):
    _, _, hf, _, ours = pair
    total = prefill + 10
    ids = _ids(total, prefill)
    cuts = [0, prefill, prefill + 1, prefill + 2, prefill + 3, total]
    want = _reference_in_steps(hf, ids, cuts)
    cache = ours.new_cache(64)
    first = ours(ids[:, :prefill], cache)
    decode = [ours(ids[:, i : i + 1], cache) for i in range(prefill, prefill + 3)]
    block = ours(ids[:, prefill + 3 : total], cache)  # 7 tokens: crosses the window of 4
    logits = torch.cat([first.logits, *(d.logits for d in decode), block.logits], dim=1)
    torch.testing.assert_close(logits, want, **TOL)


def test_a_verify_block_after_rolling_back_into_one_matches_transformers(pair):
    _, _, hf, _, ours = pair
    ids = _ids(24, 1)
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    cache = ours.new_cache(64)
    ours(ids[:, :12], cache, num_logits=1)
    ours(torch.cat([ids[:, 12:15], _ids(4, 9)], dim=1), cache)  # three right, four wrong
    cache.rollback(15)
    torch.testing.assert_close(ours(ids[:, 15:22], cache).logits, want[:, 15:22], **TOL)


def test_greedy_answers_are_transformers_generate(pair):
    """The whole answer, 32 tokens past a window of 4, as `generate` gives it."""
    variant, path, hf, _, _ = pair
    pipe = Pipeline.load(str(path), device="cpu", dtype="float32")
    for prompt in ("The quick brown fox", "def add(a, b):\n    return"):
        ids = pipe.encode(prompt, raw=True)
        with torch.no_grad():
            out = hf.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False)
        want = out[0, len(ids) :].tolist()
        want = want[: want.index(2)] if 2 in want else want  # specgen leaves out the stop
        got = pipe.generate(prompt, raw=True, max_new_tokens=32).token_ids
        assert got == want, (variant, prompt)
        assert len(set(got)) > 4 or "tied" in variant  # a varied answer (a tied one repeats)


def test_the_static_path_is_the_eager_forward(pair):
    """Decode and verify steps through `GraphedForward` (the code a CUDA graph captures, run
    eagerly) against the eager forward, with a rollback inside a verify block."""
    _, _, _, _, ours = pair
    ids = _ids(30, 2)
    eager, static = ours.new_cache(40, steps=6), ours.new_cache(40, steps=6)
    graphed = GraphedForward(ours, static, max_tokens=6, capture=False)
    for cache, forward in ((eager, ours), (static, graphed)):
        forward(ids[:, :9], cache, num_logits=1)
    for t in (1, 6, 1, 5):
        n = eager.length
        want = ours(ids[:, n : n + t], eager, taps=(1, 3))
        got = graphed(ids[:, n : n + t], static, taps=(1, 3))
        torch.testing.assert_close(got.logits, want.logits, **TOL)
        torch.testing.assert_close(got.taps[3], want.taps[3], **TOL)
        if t > 1:
            eager.rollback(n + 2), static.rollback(n + 2)
    assert graphed._steps and eager.length == static.length == 15


def test_vision_weights_are_never_read(tmp_path, monkeypatch):
    save_tiny_gemma3(tmp_path, seed=2, multimodal=True)
    keys = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith("vision_tower.") for k in keys)
    assert any(k.startswith("multi_modal_projector.") for k in keys)
    read: list[str] = []
    original = loading.SafetensorsIndex.get

    def spy(self, key, device):
        read.append(key)
        return original(self, key, device)

    monkeypatch.setattr(loading.SafetensorsIndex, "get", spy)
    load_target(tmp_path, dtype=torch.float32, device="cpu")
    assert read and all(k.startswith("language_model.") for k in read)
    assert "language_model.lm_head.weight" in read  # untied: the head beside the text model


def test_every_norm_scales_by_one_plus_its_weight(tiny_gemma3):
    """The stored zero-centred weights, plus 1 once (a second load adds nothing twice)."""
    keys = load_file(tiny_gemma3 / "model.safetensors")
    ours = load_target(tiny_gemma3, dtype=torch.float32, device="cpu")
    layer = ours.layers[2]
    for mine, key in ((layer.attn_norm, "input_layernorm"), (layer.q_norm, "self_attn.q_norm"),
                      (layer.post_ffn_norm, "post_feedforward_layernorm")):  # fmt: skip
        stored = keys[f"model.layers.2.{key}.weight"]
        assert stored.abs().max() > 0.1 and torch.equal(mine, stored + 1.0)
    assert torch.equal(ours.norm, keys["model.norm.weight"] + 1.0)
    assert layer.layer_scalar is None and not layer.shape.v_norm
    assert layer.shape.approximate == "tanh"  # gelu_pytorch_tanh


def test_an_exact_gelu_is_transformers(tmp_path):
    hf = save_tiny_gemma3(tmp_path, seed=4, hidden_activation="gelu")
    ours = load_target(tmp_path, dtype=torch.float32, device="cpu")
    assert ours.layers[0].shape.approximate == "none"
    ids = _ids(12, 4)
    with torch.no_grad():
        want = hf(input_ids=ids).logits
    torch.testing.assert_close(ours(ids, ours.new_cache(16)).logits, want, **TOL)


# --- every method on it ---------------------------------------------------------------


@pytest.mark.integration  # every method's pipeline on one target
def test_every_method_is_greedy_identical_to_ar(tiny_gemma3, tmp_path):
    """AR, the copy drafters and the block drafters (each verified whole, and scheduled)."""
    ar = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    dflash = save_tiny_dflash(tmp_path / "dflash", target_layer_ids=[1, 3])
    dspark = save_tiny_dspark(tmp_path / "dspark")
    dflash2 = save_tiny_dflash2(tmp_path / "dflash2")
    drafters = {"ngram": None, "suffix": None, "dflash": str(dflash), "dspark": str(dspark),
                "dflash2": str(dflash2), "stacked": (str(dflash), str(dspark))}  # fmt: skip
    prompts = ("The quick brown fox jumps over the lazy dog. The quick brown fox",
               "def add(a, b):\n    return a + b\ndef add(a, b):")  # fmt: skip
    for prompt in prompts:
        want = ar.generate(prompt, raw=True, max_new_tokens=32).token_ids
        assert len(want) == 32
        for method, drafter in drafters.items():
            for policy in ({"verify_policy": "full"}, {}):  # whole, and the default's lengths
                spec = SpecConfig(method=method, drafter=drafter, **policy)
                got = ar.with_spec(spec).generate(prompt, raw=True, max_new_tokens=32)
                assert got.token_ids == want, (method, policy, prompt)


# --- chat, --think ----------------------------------------------------------------------


def test_the_chat_template_is_gemmas_turns_and_think_changes_nothing(tiny_gemma3):
    from transformers import AutoTokenizer

    pipe = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    history = [{"role": "user", "content": "The quick brown fox"},
               {"role": "assistant", "content": "jumps"},
               {"role": "user", "content": "def add(a, b):"}]  # fmt: skip
    want = AutoTokenizer.from_pretrained(tiny_gemma3).apply_chat_template(
        history, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    ids = pipe.encode(history)
    assert ids == list(want)
    text = pipe.codec.decode(ids, skip_special=False)
    assert text.count("<start_of_turn>") == 4 and text.endswith("<start_of_turn>model\n")
    assert "<start_of_turn>model\njumps<end_of_turn>" in text
    assert pipe.encode(history, think=True) == ids  # Gemma 3's template has no thinking mode


def test_a_chat_reuses_its_prefix_across_the_window(tiny_gemma3):
    pipe = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    session = pipe.new_session()
    history = [{"role": "user", "content": "The quick brown fox"}]
    first = pipe.generate(history, max_new_tokens=12, session=session)
    history += [{"role": "assistant", "content": first.text},
                {"role": "user", "content": "def add(a, b):"}]  # fmt: skip
    second = pipe.generate(history, max_new_tokens=12, session=session)
    assert second.stats.prefill_tokens < second.stats.prompt_tokens - 4  # reused > window
    fresh = pipe.generate(history, max_new_tokens=12, session=pipe.new_session())
    assert second.token_ids == fresh.token_ids


# --- configs and refusals ---------------------------------------------------------------

# google/gemma-3-1b-it's config.json and google/gemma-3-4b-it's (its text_config states
# little beyond the sizes: the rest are Gemma3TextConfig's defaults)
GEMMA3_1B = {
    "architectures": ["Gemma3ForCausalLM"], "attention_bias": False,
    "attn_logit_softcapping": None, "bos_token_id": 2, "cache_implementation": "hybrid",
    "eos_token_id": [1, 106], "final_logit_softcapping": None, "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152, "intermediate_size": 6912,
    "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
    "num_hidden_layers": 26, "num_key_value_heads": 1, "pad_token_id": 0,
    "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06, "rope_local_base_freq": 10000,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": 512,
    "sliding_window_pattern": 6, "torch_dtype": "bfloat16", "vocab_size": 262144,
}  # fmt: skip
GEMMA3_4B = {
    "architectures": ["Gemma3ForConditionalGeneration"], "boi_token_index": 255999,
    "eoi_token_index": 256000, "eos_token_id": [1, 106], "image_token_index": 262144,
    "initializer_range": 0.02, "mm_tokens_per_image": 256, "model_type": "gemma3",
    "text_config": {"hidden_size": 2560, "intermediate_size": 10240,
                    "model_type": "gemma3_text", "num_hidden_layers": 34,
                    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
                    "sliding_window": 1024},
    "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                      "model_type": "siglip_vision_model", "num_attention_heads": 16,
                      "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": False},
}  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "layers", "kv", "window", "billions"),
    [(GEMMA3_1B, 26, 1, 512, (0.95, 1.05)), (GEMMA3_4B, 34, 4, 1024, (3.8, 4.0))],
)
def test_published_configs_parse_and_build(cfg, layers, kv, window, billions):
    args = model_args(copy.deepcopy(cfg), name="g3")
    g = args.layout
    assert (args.num_layers, args.num_kv_heads, g.sliding_window) == (layers, kv, window)
    assert g.layer_types.count(FULL) == layers // 6 and g.layer_types[5] == FULL
    assert g.sliding_rope.theta == 10_000.0 and g.global_rope.theta == 1e6
    assert g.scale == 256**-0.5 and args.tie_word_embeddings and args.eos_token_ids == (1, 106)
    assert (g.global_rope.kind, g.global_rope.factor) == (
        ("linear", 8.0) if cfg is GEMMA3_4B else ("default", 1.0))  # fmt: skip
    with torch.device("meta"):
        model = Transformer(args, dtype=torch.bfloat16, device="meta")
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e9
    assert billions[0] < params < billions[1], params


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (dict(use_bidirectional_attention=True), "bidirectional attention"),
        (dict(attention_bias=True), "attention biases"),
        (dict(attn_logit_softcapping=50.0), "attention logit softcapping"),
        (dict(hidden_activation="relu"), "unsupported activation 'relu'"),
        (dict(layer_types=["sliding_attention", "chunked"] * 3), "layer_types must give"),
        (dict(sliding_window=0), "sliding_window 0"),
        (dict(rope_parameters={"full_attention": {"rope_type": "yarn"}}), "RoPE scaling 'yarn'"),
        (dict(query_pre_attn_scalar=0), "query_pre_attn_scalar 0"),
        (dict(num_key_value_heads=3), "not a multiple of 3 KV heads"),
        (dict(hidden_size="wide"), "malformed field"),
    ],
)
def test_what_specgen_does_not_build_is_refused_in_one_line(tiny_gemma3, edits, message):
    cfg = json.loads((tiny_gemma3 / "config.json").read_text())
    cfg.update(edits)
    with pytest.raises(CheckpointError, match=message) as err:
        model_args(cfg, name="g3")
    assert "\n" not in str(err.value)


def test_the_cli_answers_and_refuses_a_bad_checkpoint_in_one_line(tiny_gemma3, tmp_path):
    args = ["generate", "The quick brown fox", "--raw", "--json", "-n", "8", *FAST]
    done = runner.invoke(app, [*args, "--model", str(tiny_gemma3)])
    assert done.exit_code == 0, done.stderr
    assert len(json.loads(done.stdout)["token_ids"]) == 8
    path = shutil.copytree(tiny_gemma3, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**cfg, "attn_logit_softcapping": 30.0}))
    bad = runner.invoke(app, [*args, "--model", str(path)])
    assert_one_line_error(bad, 2, "attention logit softcapping")


def test_train_a_dflash_drafter_for_it_then_decode_with_it(tiny_gemma3, tmp_path):
    """`specgen train --kind dflash` on a Gemma 3 target: a z-lab-layout drafter (Qwen3
    layers) that embeds as the target does and takes the global layers' RoPE, drafting
    from a draft vocabulary (`--draft-vocab`: a head of the answers' most frequent tokens,
    what makes a 262k-vocabulary target's drafter cheap); decoding with it is AR's answer.
    `--init target` is refused (Gemma layers are not Qwen3's)."""
    pipe = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    prompts = ["The quick brown fox", "def add(a, b):"]
    rows = [{"prompt_ids": pipe.encode(p, raw=True),
             "response_ids": pipe.generate(p, raw=True, max_new_tokens=24).token_ids}
            for p in prompts]  # fmt: skip
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "drafter"
    base = ["train", "--model", str(tiny_gemma3), "--kind", "dflash", "--data", str(data),
            "--out", str(out), "--steps", "10", "--target-layers", "1,3", "--block-size", "4",
            "--mask-token-id", str(TINY_VOCAB - 1), "--device", "cpu"]  # fmt: skip
    done = runner.invoke(app, [*base, "--draft-vocab", "24"])
    assert done.exit_code == 0, done.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["input_embedding_scale"] == 8.0
    assert len(json.loads((out / "draft_vocab.json").read_text())["token_ids"]) == 24
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e5}
    assert not {"query_pre_attn_scalar", "_sliding_window_pattern", "hidden_activation",
                "rope_local_base_freq"} & set(config)  # fmt: skip
    assert not config.get("use_sliding_window")  # Qwen3 layers attending to every key
    assert set(config.get("layer_types") or ["full_attention"]) == {"full_attention"}
    want = pipe.generate(prompts[0], raw=True, max_new_tokens=16).token_ids
    spec = SpecConfig(method="dflash", drafter=str(out), verify_policy="full")
    assert pipe.with_spec(spec).generate(prompts[0], raw=True, max_new_tokens=16).token_ids == want
    refused = runner.invoke(app, [*base[:-2], "--init", "target", "--out", str(tmp_path / "x"),
                                  "--device", "cpu"])  # fmt: skip
    assert_one_line_error(refused, 2, "Gemma 3 layers")


@pytest.mark.integration
def test_bench_holds_every_method_and_transformers_to_ar(tiny_gemma3, tmp_path):
    """`specgen bench` on a Gemma 3 target: ngram, suffix and transformers' own Gemma 3
    (`hf`) answer as AR does."""
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"category": "c", "turns": [t]}) + "\n"
                             for t in ("The quick brown fox", "def add(a, b):")))  # fmt: skip
    bench = runner.invoke(app, ["bench", "--model", str(tiny_gemma3), "--suite", str(suite),
                                "--methods", "ngram,suffix,hf", "--max-new-tokens", "12", *FAST,
                                "--json"])  # fmt: skip
    assert bench.exit_code == 0, bench.stderr
    lossless = json.loads(bench.stdout.strip().splitlines()[-1])["lossless"]
    assert {m: r["match_rate"] for m, r in lossless.items()} == {"ngram": 1.0, "suffix": 1.0,
                                                                 "hf": 1.0}  # fmt: skip


def test_drafters_built_for_other_gemmas_are_refused_in_one_line(tiny_gemma3, tiny_gemma4,
                                                                  tmp_path):  # fmt: skip
    """A DeepSpec Gemma 4 drafter (Gemma 4 layers) is not a Gemma 3 one, though the shapes
    agree; no EAGLE-3 layout is run on Gemma 3 (module docstring of families/gemma3.py)."""
    from support.eagle3 import save_eagle3
    from support.gemma4_drafters import save_deepspec_drafter

    args = ["generate", "hi", "--raw", "--model", str(tiny_gemma3), *FAST]
    g4 = save_deepspec_drafter(tmp_path / "g4", tiny_gemma4)
    done = runner.invoke(app, [*args, "--method", "dspark", "--drafter", str(g4)])
    assert_one_line_error(done, 2, "built for a Gemma 4 target, not gemma3")
    eagle = save_eagle3(tmp_path / "e3", "specforge", taps=[1, 3, 5])
    done = runner.invoke(app, [*args, "--method", "eagle3", "--drafter", str(eagle)])
    assert_one_line_error(done, 2, "no EAGLE-3 drafter on a gemma3 target")


def test_a_smaller_gemma3_drafts_for_it_as_ar(tiny_gemma3, tmp_path):
    """`--method draft`: a smaller Gemma 3 of the same tokenizer (as gemma-3-270m or -1b for
    the 4B and up) drafting with its own sliding-window cache, rolled back with the
    target's: every answer AR's, its drafts verified whole or as the scheduler chooses."""
    save_tiny_gemma3(tmp_path / "small", seed=8, num_hidden_layers=3, hidden_size=32,
                     intermediate_size=64, head_dim=8, sliding_window_pattern=3)  # fmt: skip
    ar = Pipeline.load(str(tiny_gemma3), device="cpu", dtype="float32")
    for prompt in ("The quick brown fox", "def add(a, b):\n    return a + b\ndef add(a, b):"):
        want = ar.generate(prompt, raw=True, max_new_tokens=32).token_ids
        for policy in ({"verify_policy": "full"}, {}):
            spec = SpecConfig(method="draft", drafter=str(tmp_path / "small"), **policy)
            got = ar.with_spec(spec).generate(prompt, raw=True, max_new_tokens=32)
            assert got.token_ids == want, (policy, prompt)
