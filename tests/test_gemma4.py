"""The Gemma 4 text backbone against transformers' own models, its cache and checkpoints, and
a Gemma 4 target end to end (CLI, chat sessions, training, bench, bad input).

transformers' `Gemma4ForConditionalGeneration` and `Gemma4UnifiedForConditionalGeneration`
(how google/gemma-4-12B-it is published) are the oracle, in fp32: logits and taps for a
prefill, decode steps and verify blocks after prefixes longer than the sliding window (4),
for a model with sliding and global layers, one with KV sharing (and the double-wide MLP),
one with `attention_k_eq_v`, and the unified layout, softcapping on in all.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import FULL, SLIDING
from specgen.core.errors import CheckpointError
from specgen.models import loading
from specgen.models.cache.kv import StaticKVCache
from specgen.models.families import model_args
from specgen.models.graphs import GraphedForward
from specgen.models.loading import load_target
from specgen.models.transformer import Transformer, attention_mask
from support.cli import assert_one_line_error
from support.targets import TINY_VOCAB, save_tiny_gemma4

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# fp32: the same ops in another order (logits; taps: see `assert_tap_close`)
TOL = dict(atol=2e-5, rtol=1e-5)
FAST = ["--device", "cpu", "--dtype", "float32"]
VARIANTS = {
    "mixed": {},
    "kv-shared": dict(num_kv_shared_layers=2, use_double_wide_mlp=True),
    "k-eq-v": dict(attention_k_eq_v=True),
    "unified": dict(unified=True, attention_k_eq_v=True, tie_word_embeddings=True),  # the 12B's
}
runner = CliRunner()


@pytest.fixture(scope="module", params=list(VARIANTS))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(f"g4-{request.param}")
    hf = save_tiny_gemma4(path, seed=1, initializer_range=0.1, **VARIANTS[request.param])
    return request.param, hf, load_target(path, dtype=torch.float32, device="cpu")


def _reference(hf, ids):
    with torch.no_grad():
        out = hf(input_ids=ids, output_hidden_states=True)
    return out.logits, out.hidden_states


def assert_tap_close(mine: torch.Tensor, fp32: torch.Tensor, fp64: torch.Tensor) -> None:
    """Taps ride a residual stream about 10 in size (embeddings times sqrt(hidden), four
    norms and a scalar per layer), where fp32 rounding alone moves them by up to ~7e-5:
    transformers' own fp32 taps are that far from its fp64 ones, whatever the init scale
    (measured at 0.2 to 0.02). So a tap must lie as close to transformers' fp64 value as its
    fp32 one does (twice, plus TOL); a wrong mask, position or weight is off by orders more."""
    own = (fp32.double() - fp64).abs().max().item()
    assert (mine.double() - fp64).abs().max().item() <= 2 * own + TOL["atol"]


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def test_layer_kinds_shapes_and_cache_slots(pair):
    variant, _, ours = pair
    g = ours.args.layout
    assert g.layer_types == (SLIDING, SLIDING, FULL) * 2 and g.sliding_window == 4
    assert g.head_dims == (16, 16, 32) * 2 and ours.args.logit_softcap == 10.0
    assert ours.args.embed_scale == 8.0 and g.global_rope.kind == "proportional"
    global_kv = 1 if variant in ("k-eq-v", "unified") else 2  # num_global_key_value_heads
    assert g.kv_heads == (2, 2, global_kv) * 2
    cache = ours.new_cache(16)
    if variant == "kv-shared":  # layer 4 reads layer 3's K/V, layer 5 layer 2's
        assert g.kv_source == (0, 1, 2, 3, 3, 2) and g.intermediate_sizes[4:] == (256, 256)
        assert [cache.slot(i) for i in range(6)] == [0, 1, 2, 3, 3, 2]
    for i in range(6):  # each slot shaped as its layer: [B, n_kv, capacity, d]
        assert cache.k[cache.slot(i)].shape == (1, g.kv_heads[i], 16, g.head_dims[i])
    assert len(cache.tensors()) == 4  # two shapes: one K and one V buffer each


def _reference_in_steps(hf, ids, cuts):
    """transformers' logits for `ids` fed in the same pieces with its own cache: the same
    attention over cached keys in the same order of sums as ours, where a single pass sums
    otherwise (over 21 + 10 tokens that alone moves a logit by up to 3e-5 in fp32).
    transformers 5.24 cannot decode a KV-shared model without per-layer inputs from its
    cache (`_maybe_slice_kv_shared_inputs` slices None), so that one is checked against
    the single pass."""
    from transformers import DynamicCache

    if hf.config.text_config.num_kv_shared_layers:
        return _reference(hf, ids)[0]
    cache, parts = DynamicCache(config=hf.config), []
    with torch.no_grad():
        for a, b in zip(cuts, cuts[1:], strict=False):
            out = hf(input_ids=ids[:, a:b], past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            parts.append(out.logits)
    return torch.cat(parts, dim=1)


@pytest.mark.parametrize("prefill", [3, 21])  # inside the window, and far past it
def test_prefill_decode_and_verify_block_match_transformers(pair, prefill):
    _, hf, ours = pair
    total = prefill + 10
    ids = _ids(total, prefill)
    _, ref_hidden = _reference(hf, ids)
    _, exact = _reference(copy.deepcopy(hf).double(), ids)
    cuts = [0, prefill, prefill + 1, prefill + 2, prefill + 3, total]
    ref_logits = _reference_in_steps(hf, ids, cuts)
    cache = ours.new_cache(64)
    first = ours(ids[:, :prefill], cache, taps=(0, 2, 4))
    decode = [ours(ids[:, i : i + 1], cache) for i in range(prefill, prefill + 3)]
    block = ours(ids[:, prefill + 3 : total], cache, taps=(0, 2, 4))  # 7 tokens: crosses 4
    logits = torch.cat([first.logits, *(d.logits for d in decode), block.logits], dim=1)
    torch.testing.assert_close(logits, ref_logits, **TOL)
    for layer in (0, 2, 4):  # taps are decoder-layer outputs: HF hidden_states[id + 1]
        fp32, fp64 = ref_hidden[layer + 1], exact[layer + 1]
        assert_tap_close(first.taps[layer], fp32[:, :prefill], fp64[:, :prefill])
        assert_tap_close(block.taps[layer], fp32[:, prefill + 3 :], fp64[:, prefill + 3 :])
    assert cache.length == total


def test_a_verify_block_after_rolling_back_into_one_matches_transformers(pair):
    _, hf, ours = pair
    ids = _ids(24, 1)
    ref_logits, _ = _reference(hf, ids)
    cache = ours.new_cache(64)
    ours(ids[:, :12], cache, num_logits=1)
    wrong = _ids(5, 9)
    ours(torch.cat([ids[:, 12:15], wrong[:, :4]], dim=1), cache)  # three right, four wrong
    cache.rollback(15)
    block = ours(ids[:, 15:22], cache)
    torch.testing.assert_close(block.logits, ref_logits[:, 15:22], **TOL)


def test_the_static_path_is_the_eager_forward(pair):
    """Decode and verify steps through `GraphedForward` (capture off: the code a CUDA graph
    captures, run eagerly) and `forward_static`, with a rollback inside a verify block."""
    _, _, ours = pair
    ids = _ids(30, 2)
    eager, static = ours.new_cache(40, steps=6), ours.new_cache(40, steps=6)
    graphed = GraphedForward(ours, static, max_tokens=6, capture=False)
    for cache, forward in ((eager, ours), (static, graphed)):
        forward(ids[:, :9], cache, num_logits=1)  # a prefill: always the eager forward
    for t in (1, 6, 1, 5):  # decode steps and verify blocks, from 9 to past the window
        n = eager.length
        want = ours(ids[:, n : n + t], eager, taps=(1, 3))
        got = graphed(ids[:, n : n + t], static, taps=(1, 3))
        torch.testing.assert_close(got.logits, want.logits, **TOL)
        torch.testing.assert_close(got.taps[3], want.taps[3], **TOL)
        if t > 1:  # keep two of the block, as after a partial acceptance
            eager.rollback(n + 2), static.rollback(n + 2)
    assert graphed._steps and eager.length == static.length == 15
    start = static.reserve(6)
    got = ours.forward_static(ids[:, 15:21], static, torch.tensor([start]))
    static.commit(start + 6)
    torch.testing.assert_close(got.logits, ours(ids[:, 15:21], eager).logits, **TOL)


def test_the_sliding_window_boundary_is_transformers():
    """Query q sees keys q - window < k <= q in both mask paths, as transformers' mask."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    from specgen.kernels.block_attention import _near

    oracle = sliding_window_causal_mask_function(4)
    assert attention_mask(3, 1, 4, None, torch.device("cpu")) == (None, False)  # all 4 seen
    for start, t in ((0, 9), (4, 1), (10, 1), (10, 6)):
        mask, causal = attention_mask(start, t, 4, None, torch.device("cpu"))
        keys = torch.arange(start + t - mask.shape[-1], start + t)  # older ones: dropped
        assert keys[0] == max(0, start - 3) and not causal
        for i, q in enumerate(range(start, start + t)):
            want = [bool(oracle(0, 0, torch.tensor(q), k)) for k in keys]
            assert mask[i].tolist() == want
            static = _near(torch.tensor([q]), start + t, 4)[0] & (torch.arange(start + t) <= q)
            assert static[keys].tolist() == want and not static[: keys[0]].any()


def test_head_caps_the_logits_and_embeddings_are_scaled(tiny_gemma4):
    """Drafters read the target's head: it applies the final softcapping, tanh(x / c) * c."""
    ours = load_target(tiny_gemma4, dtype=torch.float32, device="cpu")
    hidden = torch.randn(1, 5, 64, generator=torch.Generator().manual_seed(0)) * 40
    raw = hidden @ ours.lm_head.dense().T
    capped = ours.head(hidden)
    torch.testing.assert_close(capped, torch.tanh(raw / 10.0) * 10.0)
    assert capped.abs().max() < 10.0 < raw.abs().max()  # it bites here
    tokens = torch.tensor([[3, 7, 11]])
    torch.testing.assert_close(ours.embed_tokens(tokens), ours.embed.dense()[tokens] * 8.0)


def test_half_precision_tracks_transformers(tmp_path):
    """In bf16 we differ from transformers by no more than its own rounding does (the
    embedding scale rounded to bf16 first, norms scaled in fp32, as it does)."""
    hf = save_tiny_gemma4(tmp_path, seed=4)
    ids = _ids(13, 4)
    exact, _ = _reference(hf, ids)
    hf_half, _ = _reference(hf.to(torch.bfloat16), ids)
    ours = load_target(tmp_path, dtype=torch.bfloat16, device="cpu")
    mine = ours(ids, ours.new_cache(16)).logits.float()
    theirs = (hf_half.float() - exact).abs().max()
    assert (mine - exact).abs().max() <= 2 * theirs + 1e-2


@pytest.mark.parametrize("unified", [False, True])
def test_vision_and_audio_weights_are_never_read(tmp_path, monkeypatch, unified):
    save_tiny_gemma4(tmp_path, seed=2, unified=unified)
    keys = load_file(tmp_path / "model.safetensors")
    assert any(k.startswith(("model.vision", "model.embed_vision")) for k in keys)
    assert any(k.startswith(("model.audio", "model.embed_audio")) for k in keys)
    read: list[str] = []
    original = loading.SafetensorsIndex.get

    def spy(self, key, device):
        read.append(key)
        return original(self, key, device)

    monkeypatch.setattr(loading.SafetensorsIndex, "get", spy)
    load_target(tmp_path, dtype=torch.float32, device="cpu")
    assert read and all(k.startswith(("model.language_model.", "lm_head.")) for k in read)
    assert any(k.endswith("layer_scalar") for k in read)


def test_a_text_only_checkpoint(tmp_path):
    from transformers import Gemma4ForCausalLM

    hf = save_tiny_gemma4(tmp_path / "mm", seed=2, initializer_range=0.1)
    text = Gemma4ForCausalLM(hf.config.text_config).eval()
    text.model.load_state_dict(hf.model.language_model.state_dict())
    text.lm_head.weight.data.copy_(hf.lm_head.weight)
    text.save_pretrained(tmp_path / "text")
    ids = _ids(11, 2)
    want, _ = _reference(hf, ids)
    ours = load_target(tmp_path / "text", dtype=torch.float32, device="cpu")
    torch.testing.assert_close(ours(ids, ours.new_cache(16)).logits, want, **TOL)


def test_a_cache_of_mixed_shapes_keeps_the_contract():
    cache = StaticKVCache(num_layers=3, batch=2, num_kv_heads=[2, 2, 1], head_dim=[4, 4, 8],
                          capacity=10, dtype=torch.float32, device="cpu",
                          slots=[0, 1, 2, 1])  # fmt: skip
    assert [tuple(k.shape) for k in cache.k] == [(2, 2, 10, 4), (2, 2, 10, 4), (2, 1, 10, 8)]
    assert cache.slot(3) == 1 and len(cache.tensors()) == 4
    k, v = torch.ones(2, 1, 3, 8), torch.full((2, 1, 3, 8), 2.0)
    keys, values = cache.write(2, k, v)
    assert keys.shape == (2, 1, 3, 8) and torch.equal(cache.written(2)[1], v)
    cache.write(1, torch.ones(2, 2, 3, 4), torch.ones(2, 2, 3, 4))
    assert torch.equal(cache.written(3)[0], torch.ones(2, 2, 3, 4))  # layer 3 reads slot 1
    cache.commit(3)
    cache.write_at(2, torch.tensor([3]), 3 * k[:, :, :1], v[:, :, :1])
    cache.make_finite()
    assert torch.equal(cache.k[2][:, :, 3:], torch.zeros(2, 1, 7, 8))  # zeroed past length
    cache.keep_rows(torch.tensor([1]))
    assert cache.k[2].shape == (1, 1, 10, 8) and torch.equal(cache.v[2][:, :, :3], v[1:])
    cache.rollback(1)
    assert cache.length == 1


@pytest.mark.parametrize(
    ("size", "hidden", "layers", "kv", "billions"),
    [("12b", 3840, 48, (8, 1), (11.5, 12.5)), ("31b", 5376, 60, (16, 4), (29.5, 31.5))],
)
def test_published_configs_parse_and_build(size, hidden, layers, kv, billions):
    cfg = json.loads((FIXTURES / "gemma-4-12b.config.json").read_text())
    if size == "31b":  # the 31B's shapes, as transformers' Gemma 4 conversion script has them
        cfg["model_type"] = "gemma4"
        text = cfg["text_config"]
        text.update(hidden_size=5376, intermediate_size=4 * 5376, num_hidden_layers=60,
                    num_attention_heads=32, num_key_value_heads=16,
                    num_global_key_value_heads=4)  # fmt: skip
        text["layer_types"] = text["layer_types"][:6] * 10
    args = model_args(cfg, name=f"gemma-4-{size}")
    g = args.layout
    assert (args.hidden_size, args.num_layers, args.vocab_size) == (hidden, layers, 262144)
    assert (g.kv_heads[0], g.kv_heads[5]) == kv and (g.head_dims[0], g.head_dims[5]) == (256, 512)
    assert g.k_eq_v and g.sliding_window == 1024 and args.logit_softcap == 30.0
    assert g.layer_types.count(FULL) == layers // 6 and args.tie_word_embeddings
    with torch.device("meta"):
        model = Transformer(args, dtype=torch.bfloat16, device="meta")
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e9
    assert billions[0] < params < billions[1], params


def _text(path: Path, **edits) -> dict:
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"].update(edits)
    return cfg


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        (dict(hidden_size_per_layer_input=256), "per-layer input embeddings"),
        (dict(hidden_size_per_layer_input=None), "per-layer input embeddings"),  # default 256
        (dict(enable_moe_block=True, num_experts=8), "mixture-of-experts targets"),
        (dict(use_bidirectional_attention="all"), "bidirectional attention"),
        (dict(attention_bias=True), "attention biases"),
        (dict(layer_types=["sliding_attention", "chunked"] * 3), "layer_types must give"),
        (dict(num_kv_shared_layers=5), "none comes before layer 1"),
        (dict(per_layer_config={"2": {"intermediate_size": 7}}), "per_layer_config sets"),
        (dict(rope_parameters={"sliding_attention": {"rope_type": "yarn"}}), "RoPE 'yarn'"),
    ],
)
def test_what_specgen_does_not_build_is_refused_in_one_line(tiny_gemma4, edits, message):
    cfg = _text(tiny_gemma4, **edits)
    if edits.get("hidden_size_per_layer_input", 0) is None:
        del cfg["text_config"]["hidden_size_per_layer_input"]
    with pytest.raises(CheckpointError, match=message) as err:
        model_args(cfg, name="g4")
    assert "\n" not in str(err.value)


# --- the target end to end -----------------------------------------------------------


def test_cli_ar_is_transformers_greedy_generate(tiny_gemma4):
    from transformers import AutoModelForCausalLM

    from specgen.text.codec import TextCodec

    prompt = "The quick brown fox"
    args = ["generate", prompt, "--raw", "--json", "--model", str(tiny_gemma4), "-n", "24"]
    result = runner.invoke(app, [*args, *FAST, "--method", "ar"])
    assert result.exit_code == 0, result.stderr
    ids = torch.tensor([TextCodec(tiny_gemma4, "tiny", (2,)).encode_raw(prompt)])
    hf = AutoModelForCausalLM.from_pretrained(tiny_gemma4, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
    stop = want.index(2) if 2 in want else len(want)  # specgen does not emit the stop token
    got = json.loads(result.stdout)["token_ids"]
    assert got == want[:stop] and len(set(got)) > 8  # a varied answer, not one token


def test_a_chat_reuses_its_prefix_across_the_window(tiny_gemma4):
    """Turn 2 extends turn 1 far past the window (the cache is reused, every position
    kept); turn 3 diverges inside an earlier prompt (rolled back, then prefilled)."""
    pipe = Pipeline.load(str(tiny_gemma4), device="cpu", dtype="float32")
    session = pipe.new_session()
    history = [{"role": "user", "content": "The quick brown fox"}]
    first = pipe.generate(history, max_new_tokens=12, session=session)
    history += [{"role": "assistant", "content": first.text},
                {"role": "user", "content": "def add(a, b):"}]  # fmt: skip
    second = pipe.generate(history, max_new_tokens=12, session=session)
    assert second.stats.prefill_tokens < second.stats.prompt_tokens - 4  # reused > window
    fresh = pipe.generate(history, max_new_tokens=12, session=pipe.new_session())
    assert second.token_ids == fresh.token_ids
    edited = [history[0], {"role": "assistant", "content": "x"}, history[2]]
    third = pipe.generate(edited, max_new_tokens=12, session=session)
    fresh = pipe.generate(edited, max_new_tokens=12, session=pipe.new_session())
    assert third.token_ids == fresh.token_ids


def test_train_a_dflash_drafter_then_decode_and_bench_with_it(tiny_gemma4, tmp_path):
    """`specgen train --kind dflash` writes a z-lab-layout drafter for the Gemma target
    (Qwen3 layers, the target's embedding scale and softcap); decoding with it is AR's
    output; the bench runs ngram and transformers' own model beside it."""
    pipe = Pipeline.load(str(tiny_gemma4), device="cpu", dtype="float32")
    prompts = ["The quick brown fox", "def add(a, b):", "Speculative decoding"]
    rows = [{"prompt_ids": pipe.encode(p, raw=True),
             "response_ids": pipe.generate(p, raw=True, max_new_tokens=32).token_ids}
            for p in prompts]  # fmt: skip
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "drafter"
    result = runner.invoke(app, [
        "train", "--model", str(tiny_gemma4), "--kind", "dflash", "--data", str(data),
        "--out", str(out), "--steps", "20", "--target-layers", "1,3", "--block-size", "4",
        "--mask-token-id", str(TINY_VOCAB - 1), "--device", "cpu",
    ])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["input_embedding_scale"] == 8.0 and config["final_logit_softcapping"] == 10.0
    assert config["rope_parameters"] == {"rope_type": "default", "rope_theta": 1e6}
    assert not {"global_head_dim", "per_layer_config", "attention_k_eq_v"} & set(config)
    base = ["generate", prompts[0], "--raw", "--json", "--model", str(tiny_gemma4), *FAST,
            "-n", "16"]  # fmt: skip
    ar_ids = json.loads(runner.invoke(app, base).stdout)["token_ids"]
    drafted = runner.invoke(app, [*base, "--drafter", str(out)])
    assert drafted.exit_code == 0, drafted.stderr
    assert json.loads(drafted.stdout)["token_ids"] == ar_ids
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"category": "c", "turns": [t]}) + "\n"
                             for t in prompts[:2]))  # fmt: skip
    bench = runner.invoke(app, ["bench", "--model", str(tiny_gemma4), "--suite", str(suite),
                                "--methods", "ngram,hf", "--max-new-tokens", "12", *FAST,
                                "--json"])  # fmt: skip
    assert bench.exit_code == 0, bench.stderr
    last = json.loads(bench.stdout.strip().splitlines()[-1])
    assert last["lossless"]["ngram"]["match_rate"] == 1.0
    assert last["lossless"]["hf"]["match_rate"] == 1.0  # transformers' own Gemma 4


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("ple", "per-layer input embeddings"),
        ("moe", "mixture-of-experts targets are not supported"),
        ("drop", "lacks model.language_model.layers.2.self_attn.k_norm.weight"),
    ],
)
def test_bad_checkpoints_fail_in_one_line(tiny_gemma4, tmp_path, edit, message):
    path = shutil.copytree(tiny_gemma4, tmp_path / "m")
    if edit == "drop":
        tensors = load_file(path / "model.safetensors")
        tensors.pop("model.language_model.layers.2.self_attn.k_norm.weight")
        save_file(tensors, path / "model.safetensors")
    else:
        edits = dict(hidden_size_per_layer_input=64) if edit == "ple" else dict(
            enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32
        )  # fmt: skip
        (path / "config.json").write_text(json.dumps(_text(path, **edits)))
    result = runner.invoke(app, ["generate", "hi", "--model", str(path), *FAST])
    assert_one_line_error(result, 2, message)
