"""Gemma 4 drafters: DeepSpec's Gemma4DSparkModel (DSpark, and its plain DFlash block-7
checkpoint) and z-lab's Gemma 4 DFlash (Qwen3 layers with Gemma's scalars), in their
published layouts, against their reference code, and lossless on a tiny Gemma 4 target."""

from __future__ import annotations

import json
import math
import shlex

import pytest
import torch
from typer.testing import CliRunner

from oracles.gemma4_draft import reference_gemma_draft
from specgen.api.pipeline import Pipeline
from specgen.api.spec import checked_spec
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError
from specgen.export import bench_command, launch_command, notes, resolve_target
from specgen.methods.dspark.drafter import markov_draw
from specgen.methods.dspark.network import DSparkArgs, load_dspark
from specgen.models.drafters.dflash import DFlashArgs, load_dflash
from specgen.models.loading import load_target
from specgen.registry import MODELS
from specgen.scheduling.cost import CostTable
from support.cli import assert_one_line_error
from support.gemma4_drafters import (
    DFLASH_12B,
    DSPARK_12B,
    MASK,
    checkpoint_tensors,
    save_deepspec_drafter,
    save_zlab_gemma_drafter,
)
from support.statistics import chi_square_pvalue
from support.targets import FIXTURES, TINY_VOCAB

VARIANTS = {  # DeepSpec's configs for the tiny target (the 12B's: k_eq_v, vanilla rank 256)
    "dspark": {},
    "dspark-v-proj": {"k_eq_v": False},  # a target without attention_k_eq_v: v_proj
    "dspark-conf-alone": {"with_markov": False},  # the confidence head without W1[prev]
    "dflash-block7": {"rank": 0, "confidence": False},
}


def _json(name):
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", [DSPARK_12B, DFLASH_12B])
def test_published_12b_configs_parse_without_edits(name):
    args = DSparkArgs.from_hf(_json(name), name=name)
    b = args.backbone
    assert args.anchor_first and args.max_drafts == 7 and b.block_size == 7
    assert b.target_layer_ids == (5, 17, 29, 41, 46) and b.mask_token_id == 4
    assert b.num_target_layers == 48 and b.layers.num_layers == 5
    la, g = b.layers, b.gemma
    assert g is not None and g.k_eq_v and g.intermediate == (15360,) * 5
    assert (la.num_heads, la.num_kv_heads, la.head_dim, la.hidden_size) == (16, 1, 512, 3840)
    assert (la.rope.kind, la.rope.partial, la.rope.theta) == ("proportional", 0.25, 1e6)
    assert b.embed_scale == math.sqrt(3840) and b.embed_scale_rounded and b.softcap == 30.0
    assert b.windows == (None,) * 5 and b.causal == (False,) * 5
    if name == DSPARK_12B:
        assert (args.markov_rank, args.markov_kind) == (256, "vanilla")
        assert args.confidence and args.confidence_with_markov
    else:
        assert args.markov_rank == 0 and not args.confidence


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"hidden_activation": "silu"}, "unsupported activation"),
        ({"hidden_size_per_layer_input": 256}, "per-layer input embeddings"),
        ({"enable_moe_block": True}, "MoE blocks"),
        ({"num_global_key_value_heads": 3}, "16 attention heads for 3"),
        ({"rope_parameters": {"full_attention": {"rope_type": "yarn"}}}, "unsupported RoPE"),
    ],
)
def test_unsupported_gemma_draft_configs_fail_clearly(edit, message):
    with pytest.raises(CheckpointError, match=message):
        DSparkArgs.from_hf({**_json(DSPARK_12B), **edit}, name="d")


def test_zlab_scalars_are_read_as_its_reference_reads_them():
    base = _json("dflash-qwen3-4b-b16.config.json")
    plain = DFlashArgs.from_hf(base, name="z")
    assert (plain.embed_scale, plain.logit_scale, plain.softcap) == (1.0, 1.0, None)
    nested = {**base, "final_logit_softcapping": 50.0}
    nested["dflash_config"] = {
        **base["dflash_config"], "input_embedding_scale": 8.0, "output_multiplier": 0.5,
        "final_logit_softcapping": 30.0,
    }  # fmt: skip
    args = DFlashArgs.from_hf(nested, name="z")  # dflash_config first, then the top level
    assert (args.embed_scale, args.logit_scale, args.softcap) == (8.0, 0.5, 30.0)
    assert not args.embed_scale_rounded and args.gemma is None
    top = DFlashArgs.from_hf({**base, "input_embedding_scale": 2.0}, name="z")
    assert top.embed_scale == 2.0
    with pytest.raises(CheckpointError, match="output_multiplier must be a positive"):
        DFlashArgs.from_hf({**base, "output_multiplier": 0.0}, name="z")


@pytest.fixture(scope="module")
def target(tiny_gemma4):
    return load_target(tiny_gemma4, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def variants(tiny_gemma4, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-drafters")
    return {n: save_deepspec_drafter(root / n, tiny_gemma4, **kw) for n, kw in VARIANTS.items()}


@pytest.mark.parametrize("name", VARIANTS)
def test_tiny_deepspec_gemma_checkpoints_load(target, variants, name):
    net = load_dspark(variants[name], target=target, target_name="tiny", name=name)
    layer = net.backbone.layers[1]
    assert layer.layer_scalar.item() != 1.0  # layer_scalar was read
    assert layer.wqkv.shape[0] == 4 * 32 + 32 * (1 if VARIANTS[name].get("k_eq_v", True) else 4)
    assert net.args.first_slot == 0 and net.args.max_drafts == 7


def _fast(net, target, features, anchor, k_split=9):
    """The cached fast path: context committed in two pieces, the block after it."""
    b = net.args.backbone.block_size
    cache = net.backbone.new_cache(64)
    cache.make_finite()
    net.backbone.extend(cache, features[None, :k_split])
    net.backbone.extend(cache, features[None, k_split:])
    ids = torch.tensor([[anchor] + [MASK] * (b - 1)])
    block = net.backbone.embed_block(target, ids)
    hidden = net.backbone.block_hidden(cache, block)
    static = net.backbone.block_hidden_static(cache, block, torch.tensor([features.shape[0]]))
    torch.testing.assert_close(static, hidden, atol=1e-5, rtol=1e-5)
    return hidden[0]


@pytest.mark.parametrize("name", VARIANTS)
def test_fast_path_equals_deepspecs_model_step_by_step(tiny_gemma4, target, variants, name):
    """Block hidden states, soft-capped base logits, the Markov draw and the confidences
    against the slow oracle written from DeepSpec's modeling file (float64, its names)."""
    path = variants[name]
    net = load_dspark(path, target=target, target_name="tiny", name=name)
    cfg = json.loads((path / "config.json").read_text())
    features = torch.randn(13, 128, generator=torch.Generator().manual_seed(1))
    hidden = _fast(net, target, features, anchor=7)
    base = net.backbone.head(target, hidden)
    draft = markov_draw(net, base, hidden, 7, SamplingParams(), None)
    tokens = draft.tokens[0].tolist()
    ref = reference_gemma_draft(
        checkpoint_tensors(path),
        cfg,
        target.embed.dense(),
        target.lm_head.dense(),
        features,
        7,
        tokens,
    )
    torch.testing.assert_close(hidden.double(), ref.hidden, atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(base.double(), ref.base, atol=1e-4, rtol=1e-5)
    assert tokens == ref.logits.argmax(-1).tolist()  # each slot's argmax given the previous
    if net.args.markov_rank and net.args.markov_kind == "vanilla":
        assert tokens != ref.base.argmax(-1).tolist()  # the Markov head mattered here
    if ref.confidence is None:
        assert draft.confidence is None
    else:  # the confidence of slot j read before token j is drawn (W1 of token j-1)
        conf = draft.confidence[0].double()
        torch.testing.assert_close(conf, ref.confidence.sigmoid(), atol=1e-5, rtol=0)


def test_the_softcap_and_embedding_scale_are_the_drafters(tiny_gemma4, target, variants):
    """DeepSpec's Gemma drafter caps with its own config's value and scales its block by
    sqrt(H) whatever the target does: a drafter capped elsewhere gives other base logits."""
    path = variants["dspark"]
    net = load_dspark(path, target=target, target_name="tiny", name="d")
    ids = torch.tensor([[7, MASK]])
    assert torch.equal(net.backbone.embed_block(target, ids), target.embed_tokens(ids))
    cfg = json.loads((path / "config.json").read_text())
    other = DSparkArgs.from_hf({**cfg, "final_logit_softcapping": 3.0}, name="d").backbone
    assert other.softcap == 3.0 and net.args.backbone.softcap == 10.0


def test_a_deepspec_gemma_drafter_missing_a_tensor_fails_clearly(target, tiny_gemma4, tmp_path):
    for drop in ("layers.1.mlp.up_proj.weight", "layers.0.self_attn.k_norm.weight"):
        path = save_deepspec_drafter(tmp_path / drop, tiny_gemma4, drop=drop)
        with pytest.raises(CheckpointError, match=f"lacks {drop.replace('.', '[.]')}"):
            load_dspark(path, target=target, target_name="tiny", name="bad")
    path = save_deepspec_drafter(tmp_path / "v", tiny_gemma4)  # k_eq_v: no v_proj
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(attention_k_eq_v=False, num_key_value_heads=1)  # now it should have one
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="lacks layers.0.self_attn.v_proj.weight"):
        load_dspark(path, target=target, target_name="tiny", name="bad")


def test_a_gemma_drafter_on_a_qwen_target_names_both(tiny_qwen3_deep, tiny_gemma4, tmp_path):
    qwen = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    path = save_deepspec_drafter(tmp_path / "d", tiny_gemma4)
    with pytest.raises(
        CheckpointError,
        match=r"drafter gemma-d does not fit target qwen-t: its Gemma 4 layers were built "
        r"for a Gemma 4 target, not qwen3",
    ):
        load_dspark(path, target=qwen, target_name="qwen-t", name="gemma-d")


@pytest.mark.parametrize("where", ["dflash_config", "top", "none"])
def test_zlab_gemma_dflash_equals_zlabs_reference(tiny_gemma4, target, tmp_path, where):
    """z-lab's PyPI `dflash` on the same checkpoint and target: the block embedding
    (`_raw_input_embeddings` with `input_embedding_scale`), the hidden states and the
    logits (`compute_logits`: `output_multiplier`, `final_logit_softcapping`)."""
    pytest.importorskip("dflash")
    from dflash import DFlashDraftModel
    from dflash.model import _draft_value, _output_head, _raw_input_embeddings
    from transformers import AutoModelForImageTextToText

    path = save_zlab_gemma_drafter(tmp_path / "z", tiny_gemma4, where=where, multiplier=0.5)
    hf = AutoModelForImageTextToText.from_pretrained(tiny_gemma4, dtype=torch.float32).eval()
    reference = DFlashDraftModel.from_pretrained(path, dtype=torch.float32).eval()
    ours = load_dflash(path, target=target, target_name="tiny", name="z")
    context, block = 13, 8
    features = torch.randn(1, context, 128, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[7] + [MASK] * (block - 1)])
    scale = float(_draft_value(reference.config, "input_embedding_scale", 1.0))
    embedded = _raw_input_embeddings(hf, ids, scale)
    torch.testing.assert_close(ours.embed_block(target, ids), embedded, atol=0, rtol=0)
    with torch.no_grad():
        want = reference(
            position_ids=torch.arange(context + block)[None],
            noise_embedding=embedded,
            target_hidden=features,
        )
        want_logits = reference.compute_logits(want[:, 1:], _output_head(hf))
    cache = ours.new_cache(64)
    ours.extend(cache, features)
    hidden = ours.block_hidden(cache, embedded)
    torch.testing.assert_close(hidden, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.head(target, hidden[:, 1:]), want_logits, atol=1e-5, rtol=0)
    capped = where != "none"
    assert (ours.args.softcap == 10.0) == capped and (ours.args.embed_scale == 8.0) == capped
    assert bool(want_logits.abs().max() < 10.0) or not capped


def test_the_gemma_4_12b_alias_its_stack_and_its_exports():
    entry = MODELS["gemma-4-12b"]
    assert entry.repo == "google/gemma-4-12B-it" and entry.thinking is False
    zlab, deepspec = "z-lab/gemma4-12B-it-DFlash", "deepseek-ai/dspark_gemma4_12b_block7"
    eagle3 = "deepseek-ai/eagle3_gemma4_12b_ttt7"
    assert entry.drafters == {"dflash": zlab, "dspark": deepspec, "eagle3": eagle3}
    stacked = checked_spec(SpecConfig(method="stacked"), "gemma-4-12b").drafter
    assert stacked == (zlab, deepspec, eagle3, "suffix")  # and the copy drafter beside them
    dspark = resolve_target("gemma-4-12b", "dspark", None, None)
    argv = shlex.split(launch_command("vllm", dspark))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert argv[2] == "google/gemma-4-12B-it" and config["model"] == deepspec
    assert config["method"] == "dspark" and config["num_speculative_tokens"] == 7
    assert "--speculative-dspark-block-size 7" in launch_command("sglang", dspark)
    dflash = resolve_target("gemma-4-12b", "dflash", None, None)
    assert f"--speculative-draft-model-path {zlab} --speculative-num-draft-tokens 16" in (
        launch_command("sglang", dflash)
    )
    assert any("#41703" in n for n in notes("vllm", dflash))
    assert any('"enable_thinking": false' in n for n in notes("sglang", dspark))
    assert bench_command(dflash).endswith("--no-think")


# --- on the tiny Gemma 4 target, through the pipeline and the CLI ------------------------

PROMPTS = ["The quick brown fox", "def add(a, b):", "Speculative decoding drafts tokens"]
TRAINED_ON = [*PROMPTS, "Café, naïve", "return a + b", "the lazy dog", "verifies them"]
FAST = ["--device", "cpu", "--dtype", "float32"]
runner = CliRunner()


@pytest.fixture(scope="module")
def ar(tiny_gemma4):
    return Pipeline.load(str(tiny_gemma4), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def drafters(tiny_gemma4, ar, variants, tmp_path_factory):
    """The DeepSpec drafters, a random z-lab one, and a z-lab one `specgen train` wrote
    for the target (300 steps on its own answers: it drafts some steps well, some not)."""
    out = tmp_path_factory.mktemp("gemma-pipeline")
    rows = []
    for text in TRAINED_ON:
        answer = ar.generate(text, raw=True, max_new_tokens=48, session=ar.new_session())
        rows.append({"prompt_ids": ar.encode(text, raw=True), "response_ids": answer.token_ids})
    (out / "answers.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, [
        "train", "--model", str(tiny_gemma4), "--kind", "dflash", "--data",
        str(out / "answers.jsonl"), "--out", str(out / "trained"), "--steps", "300",
        "--target-layers", "1,3", "--block-size", "6", "--mask-token-id", str(MASK),
        "--lr", "3e-3", "--device", "cpu",
    ])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    zlab = save_zlab_gemma_drafter(out / "zlab", tiny_gemma4, multiplier=0.5)
    return {"zlab": zlab, "trained": out / "trained", **variants}


CASES = {  # method (None: read from the drafter's config), drafters
    "zlab dflash": ("dflash", ("zlab",)),
    "trained zlab dflash": ("dflash", ("trained",)),
    "deepspec dspark": ("dspark", ("dspark",)),
    "deepspec dflash block7": (None, ("dflash-block7",)),  # its config: the DSpark class
    "stacked": ("stacked", ("trained", "dspark")),
}


def _pipe(ar, drafters, case, **kw):
    """Stacked decides which drafter drafts from fixed prices (each draft 0.1, a verify of
    n drafts 1 + 0.01 n), not this machine's measured ones: which drafter drafts must not
    depend on timing."""
    method, names = CASES[case]
    paths = tuple(str(drafters[n]) for n in names)
    spec = SpecConfig(method=method or "ar", drafter=paths, trace=True, **kw)
    if method != "stacked":
        return ar.with_spec(spec)
    loaded = ar.with_spec(spec)
    steps = tuple(1.0 + 0.01 * n for n in range(8))
    costs = CostTable(contexts=(1,), seconds=(steps,), drafts={n: (0.1,) for n in loaded.drafters})
    return ar.with_spec(spec, costs=costs)


@pytest.mark.parametrize("case", CASES)
def test_greedy_equals_plain_decoding_with_drafts_verified(ar, drafters, case):
    pipe = _pipe(ar, drafters, case, verify_policy="full")
    assert pipe.spec.method == (CASES[case][0] or "dspark")
    steps, used = [], set()
    for prompt in PROMPTS:
        want = ar.generate(prompt, raw=True, max_new_tokens=32, session=ar.new_session())
        got = pipe.generate(prompt, raw=True, max_new_tokens=32, session=pipe.new_session())
        assert got.token_ids == want.token_ids, prompt
        steps += got.stats.trace[1:]
        used |= set(got.stats.by_drafter)
    assert all(0 <= r["accepted"] <= r["verify_length"] <= len(r["draft"]) for r in steps)
    assert sum(r["verify_length"] for r in steps) >= 2 * len(steps)  # drafts really verified
    if "trained" in case or case == "stacked":
        accepted = [(r["accepted"], r["verify_length"]) for r in steps]
        assert any(0 < a < n for a, n in accepted)  # partly accepted
        assert any(a == n > 0 for a, n in accepted), accepted  # and wholly
    if case == "stacked":
        assert used == {"dflash", "dspark"}


@pytest.mark.statistical
@pytest.mark.parametrize(
    "case",
    ["deepspec dspark", "trained zlab dflash", pytest.param("stacked", marks=pytest.mark.slow)],
)
def test_sampling_keeps_the_targets_distribution(ar, drafters, case):
    """The second token's empirical distribution converges to the exact one (T = 1): the
    first step drafts it (DSpark: sampled from its Markov-corrected distribution) and the
    verifier accepts or corrects it."""
    from specgen.verify.sampling import probabilities

    pipe = _pipe(ar, drafters, case, verify_policy="full")
    model, params = ar.model, SamplingParams(temperature=1.0, top_k=4)
    prompt = ar.encode(PROMPTS[0], raw=True)
    first = probabilities(model(torch.tensor([prompt]), model.new_cache(32)).logits[0, -1], params)
    seconds = torch.tensor([prompt + [x] for x in range(TINY_VOCAB)])
    logits = model(seconds, model.new_cache(32, batch=TINY_VOCAB)).logits[:, -1]
    exact = first @ probabilities(logits, params)  # P(x2) = sum_x1 p(x1) p(x2 | x1)
    counts, n, session, verified = torch.zeros(TINY_VOCAB), 600, pipe.new_session(), 0
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        out = pipe.generate(PROMPTS[0], raw=True, sampling=sampling, max_new_tokens=3,
                            session=session)  # fmt: skip
        counts[out.token_ids[1]] += 1
        verified += out.stats.verified
    assert verified >= n  # the second token was drafted and verified, not only sampled
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    assert tv < 0.1, tv
    assert chi_square_pvalue(counts, exact) > 1e-3  # seeded: the same draws on every run
    shifted = exact.roll(1) * 0.1 + exact * 0.9  # and the test can tell a near miss
    assert chi_square_pvalue(counts, shifted) < 1e-6


def test_cli_trace_records_every_step(tiny_gemma4, drafters):
    base = ["generate", PROMPTS[1], "--raw", "--json", "--model", str(tiny_gemma4), *FAST,
            "-n", "20", "--verify-policy", "full"]  # fmt: skip
    ar_ids = json.loads(runner.invoke(app, base).stdout)["token_ids"]
    args = [*base, "--drafter", str(drafters["trained"]), "--drafter", str(drafters["dspark"])]
    result = runner.invoke(app, [*args, "--trace"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["token_ids"] == ar_ids
    trace = record["trace"]
    assert len(trace) == record["stats"]["steps"]
    keys = {"drafter", "draft", "verify_length", "accepted", "bonus"}
    assert all(keys <= set(r) for r in trace)
    committed = sum(r["accepted"] + 1 for r in trace)  # every step: its accepted + bonus
    assert committed == len(record["token_ids"]) or committed == len(record["token_ids"]) + 1
    dspark_steps = [r for r in trace if r["drafter"] == "dspark" and r["draft"]]
    assert all(len(r["confidence"]) == len(r["draft"]) for r in dspark_steps)


def test_cli_a_gemma_drafter_on_a_qwen_target_is_one_line(tiny_qwen3_deep, drafters):
    result = runner.invoke(app, ["generate", "hi", "--model", str(tiny_qwen3_deep), *FAST,
                                 "--drafter", str(drafters["dspark"])])  # fmt: skip
    assert_one_line_error(
        result, 2, "does not fit target", str(tiny_qwen3_deep), str(drafters["dspark"]),
        "built for a Gemma 4 target, not qwen3",
    )  # fmt: skip


@pytest.mark.parametrize("case", ["trained zlab dflash", "deepspec dspark", "stacked"])
def test_the_resident_loop_and_the_static_step_past_the_window(ar, drafters, case):
    """The device-resident loop over the graph-capturable forward (capture off: the code a
    CUDA graph captures, run eagerly), drafting with Gemma drafters, gives AR's tokens far
    past the sliding window (4), and leaves the drafter's context at the target's."""
    from specgen.core.config import SamplingParams as Params
    from specgen.engine.resident import generate_resident
    from specgen.models.graphs import GraphedForward

    pipe = _pipe(ar, drafters, case, verify_policy="full")
    for prompt in PROMPTS[:2]:
        ids = ar.encode(prompt, raw=True)
        want = ar.generate(prompt, raw=True, max_new_tokens=40, session=ar.new_session())
        session = pipe.new_session()
        steps = session.drafter.max_draft_tokens + 1
        cache = ar.model.new_cache(128, steps=steps)
        forward = GraphedForward(ar.model, cache, max_tokens=steps, capture=False)
        events = list(generate_resident(
            forward, cache, session.drafter, ids, params=Params(), max_new_tokens=40,
            stop_ids=frozenset(),
        ))  # fmt: skip
        got = [t for e in events for t in e.tokens]  # no stop ids: it runs to 40
        assert len(got) == 40 and got[: len(want.token_ids)] == want.token_ids, prompt
        assert any(e.verified > 1 for e in events)  # drafts were verified
