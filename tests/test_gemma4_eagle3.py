"""DeepSpec's Gemma 4 EAGLE-3 drafter (`Gemma4Eagle3Model`, eagle3_gemma4_12b_ttt7): its
config, tiny checkpoints in its state dict's layout, drafts token for token against a
float64 oracle written from DeepSpec's modeling and evaluator code (every path: the sync
chain, the fixed-shape chain, the resident steps), lossless on a tiny Gemma 4 target, and
mismatched pairs refused in one line naming both."""

from __future__ import annotations

import json

import pytest
import torch

from oracles.gemma4_eagle3 import reference_gemma_eagle3_chain
from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError
from specgen.methods.eagle3.config import Eagle3Args, check_pair
from specgen.methods.eagle3.network import load_eagle3
from specgen.models.families import model_args
from specgen.models.loading import load_target
from specgen.verify.sampling import probabilities
from support.cli import FAST, assert_one_line_error, run
from support.eagle3 import save_eagle3
from support.gemma4_drafters import checkpoint_tensors, save_deepspec_eagle3
from support.statistics import second_token_tv
from support.targets import FIXTURES, TINY_VOCAB

CONFIG_12B = "eagle3-gemma4-12b-ttt7.config.json"
PROMPTS = ("The quick brown fox", "def add(a, b):", "one two one two one two")
VARIANTS = {  # the 12B's shape (k_eq_v, one global KV head, one layer); v_proj, two layers
    "12b-like": {},
    "v-proj-2-layers": {"k_eq_v": False, "layers": 2},
}


def _json(name):
    return json.loads((FIXTURES / name).read_text())


def test_the_12b_config_reads_as_deepspecs_model_builds_it():
    args = Eagle3Args.from_hf(_json(CONFIG_12B), num_target_layers=48, name="d")
    la, g = args.layers, args.gemma
    assert args.layout == "deepspec" and g is not None and g.k_eq_v
    assert args.taps == (5, 17, 29, 41, 46) and args.chain == 7 and args.softcap == 30.0
    assert (la.num_layers, la.hidden_size, la.num_heads) == (1, 3840, 16)
    assert (la.num_kv_heads, la.head_dim, g.intermediate) == (1, 512, (15360,))
    assert (la.rope.kind, la.rope.partial, la.rope.theta) == ("proportional", 0.25, 1e6)
    assert args.target_head and args.every_layer_fused and args.draft_vocab == 262144
    gemma = model_args(_json("gemma-4-12b.config.json"))
    fc, head = (3840, 5 * 3840), (262144, 3840)
    ids = check_pair(args, gemma, "d", "g", d2t=None, t2d=None, fc=fc, head=head)
    assert ids.shape == (262144,)
    qwen = model_args(_json("qwen3-8b.config.json"))
    with pytest.raises(CheckpointError) as info:
        check_pair(args, qwen, "d", "qwen3-8b", d2t=None, t2d=None, fc=fc, head=head)
    message = str(info.value)
    assert message.startswith("drafter d does not fit target qwen3-8b: ") and "\n" not in message
    assert "Gemma 4 EAGLE-3 drafter (Gemma4Eagle3Model) for a qwen3 target" in message


@pytest.fixture(scope="module")
def target(tiny_gemma4):
    return load_target(tiny_gemma4, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def ar(tiny_gemma4):
    return Pipeline.load(str(tiny_gemma4), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def variants(tiny_gemma4, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma-eagle3")
    return {n: save_deepspec_eagle3(root / n, tiny_gemma4, **kw) for n, kw in VARIANTS.items()}


def _pipe(ar, drafter, **kw):
    spec = SpecConfig(method="eagle3", drafter=str(drafter), verify_policy="full", **kw)
    return ar.with_spec(spec)


@pytest.mark.parametrize("name", VARIANTS)
def test_tiny_checkpoints_load_with_every_tensor(target, variants, name):
    net = load_eagle3(variants[name], target=target, target_name="tiny", name=name)
    layer = net.layers[-1]
    assert layer.layer_scalar.item() != 1.0  # layer_scalar was read
    k_eq_v = VARIANTS[name].get("k_eq_v", True)
    assert tuple(layer.wqkv.shape) == (4 * 32 + 32 * (1 if k_eq_v else 4), 128)  # reads 2H
    assert net.norm.dtype == net.hidden_norms[0].dtype == torch.float32  # Gemma's norms


@pytest.mark.parametrize(
    "drop", ["layers.0.hidden_norm.weight", "layers.0.self_attn.k_norm.weight", "fc.weight"]
)
def test_a_missing_tensor_is_named(target, tiny_gemma4, tmp_path, drop):
    path = save_deepspec_eagle3(tmp_path / "d", tiny_gemma4, drop=drop)
    with pytest.raises(CheckpointError, match=f"lacks {drop.replace('.', '[.]')}"):
        load_eagle3(path, target=target, target_name="tiny", name="bad")


def _taps(drafter, features):  # [n, 5H] -> the taps `observe` reads, [1, n, H] each
    chunks = features[None].chunk(len(drafter.taps), dim=-1)
    return dict(zip(drafter.taps, chunks, strict=True))


@pytest.mark.parametrize("name", VARIANTS)
def test_drafts_equal_deepspecs_model_on_every_path(ar, variants, name):
    """Random target features, committed in uneven pieces with rollbacks: the sync chain,
    the fixed-shape chain and the resident steps each draft what the oracle drafts."""
    path = variants[name]
    pipe = _pipe(ar, path)
    cfg = json.loads((path / "config.json").read_text())
    tensors = checkpoint_tensors(path)
    gen = torch.Generator().manual_seed(2)
    features = torch.randn(40, 5 * 64, generator=gen)
    seq = torch.randint(0, TINY_VOCAB, (41,), generator=gen).tolist()
    sync, fixed = pipe.method.new_drafter(64), pipe.method.new_drafter(64)
    fixed.steps = fixed.steps.uncaptured()
    same = total = 0
    n = 0
    for size, back, k in ((9, 0, 7), (1, 0, 3), (4, 0, 7), (6, 3, 5), (2, 0, 1), (5, 0, 7)):
        if back:
            n -= back
            sync.rollback(n)
            fixed.rollback(n)
        for d in (sync, fixed):
            d.observe(seq[n : n + size], _taps(d, features[n : n + size]))
        n += size
        want, _ = reference_gemma_eagle3_chain(tensors, cfg, features[:n], seq[:n], seq[n], k)
        for d in (sync, fixed):
            same += d.propose(seq[n], k).tokens[0].tolist() == want
            total += 1
    # resident steps from here: blocks with their first `a` drafts right, lengths on the device
    resident = pipe.method.new_drafter(64)
    resident.observe(seq[:n], _taps(resident, features[:n]))
    resident.begin_resident()
    for verified, accepted, k in ((3, 1, 7), (4, 4, 2), (2, 0, 7), (5, 3, 4)):
        start = torch.tensor([n])
        got = resident.draft_at(torch.tensor([[seq[n]]]), start, k).tokens[0].tolist()
        want, _ = reference_gemma_eagle3_chain(tensors, cfg, features[:n], seq[:n], seq[n], k)
        same += got == want
        total += 1
        block = torch.tensor([seq[n : n + 1 + verified]])
        block[0, 1 + accepted :] = (block[0, 1 + accepted :] + 1) % TINY_VOCAB  # rejected
        taps = _taps(resident, features[n : n + 1 + verified])  # (wrong past `accepted`)
        resident.observe_at(block, taps, start)
        n += accepted + 1
        resident.assume(n)
    print(f"{name}: drafts identical {same}/{total}")
    assert same == total == 16


def test_sampled_chains_hand_over_deepspecs_distributions(ar, variants):
    """A sampled chain's q at each position: the request's filters over the oracle's
    logits of the chain drawn (DeepSpec's evaluator samples at temperature the same way)."""
    path = variants["12b-like"]
    drafter = _pipe(ar, path).method.new_drafter(64)
    cfg = json.loads((path / "config.json").read_text())
    tensors = checkpoint_tensors(path)
    gen = torch.Generator().manual_seed(5)
    features = torch.randn(12, 5 * 64, generator=gen)
    seq = torch.randint(0, TINY_VOCAB, (13,), generator=gen).tolist()
    drafter.observe(seq[:12], _taps(drafter, features))
    params = SamplingParams(temperature=0.7, top_k=50)
    for seed in range(4):
        draft = drafter.propose(seq[12], 4, params, torch.Generator().manual_seed(seed))
        tokens = draft.tokens[0].tolist()
        _, logits = reference_gemma_eagle3_chain(
            tensors, cfg, features, seq[:12], seq[12], 4, forced=tokens
        )
        for j, z in enumerate(logits):
            want = probabilities(z.float()[None], params)[0]
            torch.testing.assert_close(draft.probs[0, j], want, atol=2e-5, rtol=1e-4)


def test_drafts_of_a_real_run_equal_the_reference(ar, tiny_gemma4, variants):
    """Every draft of two answers in one session (the second reuses a prefix: a rollback),
    against the oracle fed transformers' own Gemma 4 hidden states in float64."""
    from transformers import AutoModelForImageTextToText

    path = variants["12b-like"]
    pipe = _pipe(ar, path, trace=True)
    hf = AutoModelForImageTextToText.from_pretrained(tiny_gemma4, dtype=torch.float64).eval()
    cfg = json.loads((path / "config.json").read_text())
    tensors, taps = checkpoint_tensors(path), cfg["target_layer_ids"]
    session, same, total = pipe.new_session(), 0, 0
    for text in ("The quick brown fox", "The quick brown fox jumps over"):
        prompt = pipe.encode(text, raw=True)
        out = pipe.generate(text, raw=True, max_new_tokens=20, session=session)
        committed = list(prompt) + out.stats.trace[0]["committed"]
        for record in out.stats.trace[1:]:
            tokens, anchor = committed[:-1], committed[-1]
            with torch.no_grad():
                states = hf(input_ids=torch.tensor([tokens]), output_hidden_states=True)
            features = torch.cat([states.hidden_states[i + 1][0] for i in taps], -1)
            want, _ = reference_gemma_eagle3_chain(
                tensors, cfg, features, tokens, anchor, len(record["draft"])
            )
            same += want == record["draft"]
            total += 1
            committed += record["committed"]
    print(f"real run on tiny Gemma 4: drafts identical {same}/{total}")
    assert total > 20 and same == total


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_equals_ar_and_the_resident_loop_the_sync_loop(ar, variants, name, monkeypatch):
    pipe = _pipe(ar, variants[name], trace=True, engine="sync")
    sampled = SamplingParams(temperature=1.5, top_k=100, seed=3)
    sync = [pipe.generate(p, max_new_tokens=24, session=pipe.new_session()) for p in PROMPTS]
    kw = dict(sampling=sampled, max_new_tokens=24)
    sync_sampled = pipe.generate(PROMPTS[0], session=pipe.new_session(), **kw)
    for prompt, got in zip(PROMPTS, sync, strict=True):
        want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session())
        assert got.token_ids == want.token_ids
        assert sum(r["verify_length"] for r in got.stats.trace[1:]) > 0
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    for prompt, want in zip(PROMPTS, sync, strict=True):
        got = pipe.generate(prompt, max_new_tokens=24, session=pipe.new_session())
        assert got.token_ids == want.token_ids
        assert [r["draft"] for r in got.stats.trace] == [r["draft"] for r in want.stats.trace]
    got = pipe.generate(PROMPTS[0], session=pipe.new_session(), **kw)
    assert got.token_ids == sync_sampled.token_ids


@pytest.mark.statistical
def test_sampling_through_the_gemma_drafter_has_the_target_distribution(ar, target, variants):
    tv, far = second_token_tv(_pipe(ar, variants["12b-like"]), target)
    assert tv < 0.06 and tv < far / 5, (tv, far)


def test_stacked_on_gemma_mounts_it_beside_dspark(ar, tiny_gemma4, variants, tmp_path):
    from support.gemma4_drafters import save_deepspec_drafter

    dspark = save_deepspec_drafter(tmp_path / "dspark", tiny_gemma4)
    spec = SpecConfig(
        method="stacked", drafter=(str(dspark), str(variants["12b-like"])), verify_policy="full"
    )
    pipe = ar.with_spec(spec)
    assert pipe.drafters == ("dspark", "eagle3")
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session()).token_ids
        assert pipe.generate(prompt, max_new_tokens=24).token_ids == want


def test_mismatched_pairs_are_refused_naming_both(
    target, tiny_gemma4, tiny_qwen3_deep, variants, tmp_path
):
    qwen = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    gemma_drafter = variants["12b-like"]
    with pytest.raises(CheckpointError) as info:
        load_eagle3(gemma_drafter, target=qwen, target_name="qwen-t", name="gemma-d")
    message = str(info.value)
    assert message.startswith("drafter gemma-d does not fit target qwen-t:")
    assert "Gemma 4 EAGLE-3 drafter (Gemma4Eagle3Model) for a qwen3 target" in message
    specforge = save_eagle3(tmp_path / "sf", "specforge", taps=[1, 2, 3])
    with pytest.raises(CheckpointError) as info:
        load_eagle3(specforge, target=target, target_name="gemma-t", name="sf-d")
    message = str(info.value)
    assert message.startswith("drafter sf-d does not fit target gemma-t:") and "\n" not in message
    assert "takes DeepSpec's Gemma 4 EAGLE-3 drafters only" in message
    for model, drafter in ((tiny_qwen3_deep, gemma_drafter), (tiny_gemma4, specforge)):
        result = run("generate", "hi", "--model", str(model), "--drafter", str(drafter), *FAST)
        assert_one_line_error(result, 2, str(drafter), str(model), "does not fit target")


def test_a_local_gemma_eagle3_exports_as_deepspecs(tiny_gemma4, variants):
    from specgen.export import notes, resolve_target

    serve = resolve_target(str(tiny_gemma4), "eagle3", str(variants["12b-like"]), None)
    assert serve.block_size == 7  # its ttt_length
    assert any("Gemma4Eagle3Model" in n for n in notes("vllm", serve))
