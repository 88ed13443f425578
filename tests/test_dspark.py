"""DSpark: DeepSpec's format, the Markov/confidence heads against their slow oracle, and
losslessness under every verify policy."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from oracles.dflash import reference_block_hidden
from oracles.dspark import reference_heads
from specgen.api.pipeline import Pipeline
from specgen.api.spec import load_method
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.drafting.vocab import save_draft_vocab
from specgen.methods.dspark.drafter import markov_draw
from specgen.methods.dspark.network import DSparkArgs, load_dspark
from specgen.models.drafters.dflash import check_pair
from specgen.models.families import model_args
from specgen.models.loading import load_target
from specgen.scheduling.cost import CostTable
from specgen.verify.sampling import make_generator, probabilities
from support.drafters import save_tiny_dspark
from support.statistics import chi_square_pvalue, exact_token_distribution
from support.targets import FIXTURES, TINY_VOCAB

FIXTURE = "dspark-qwen3-4b-block7.config.json"
VARIANTS = {
    "vanilla": {},
    "gated": {"kind": "gated"},
    "rnn": {"kind": "rnn"},
    "conf-no-markov": {"with_markov": False, "conf_bias": False},
    "deepspec-dflash": {"rank": 0, "confidence": False},
    "dflash-layout": {"anchor_first": False},
}


def _json(name):
    return json.loads((FIXTURES / name).read_text())


def test_real_deepspec_config_parses_without_edits():
    args = DSparkArgs.from_hf(_json(FIXTURE), name="deepseek-ai/dspark_qwen3_4b_block7")
    assert args.anchor_first and args.first_slot == 0 and args.max_drafts == 7
    assert args.markov_rank == 256 and args.markov_kind == "vanilla"
    assert args.confidence and args.confidence_with_markov
    b = args.backbone
    assert b.block_size == 7 and b.mask_token_id == 151669 and b.num_target_layers == 36
    assert b.target_layer_ids == (1, 9, 17, 25, 33) and b.layers.rope.theta == 1e6
    check_pair(b, model_args(_json("qwen3-4b.config.json")), "dspark-4b", "qwen3-4b")
    with pytest.raises(CheckpointError, match="hidden size 2560 vs 4096"):
        check_pair(b, model_args(_json("qwen3-8b.config.json")), "dspark-4b", "qwen3-8b")


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"markov_head_type": "lstm"}, "markov_head_type must be one of"),
        ({"markov_rank": -1}, "markov_rank must be >= 0"),
        ({"markov_rank": 0}, "confidence_head_with_markov needs markov_rank"),
        ({"mask_token_id": None}, "mask_token_id"),
    ],
)
def test_malformed_configs_fail_clearly(edit, message):
    with pytest.raises(CheckpointError, match=message):
        DSparkArgs.from_hf({**_json(FIXTURE), **edit}, name="d")


@pytest.fixture(scope="module")
def target(tiny_qwen3_deep):
    return load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def variants(tmp_path_factory):
    root = tmp_path_factory.mktemp("dspark-variants")
    return {name: save_tiny_dspark(root / name, **kw) for name, kw in VARIANTS.items()}


@pytest.mark.parametrize("name", VARIANTS)
def test_tiny_deepspec_checkpoints_load(target, variants, name):
    net = load_dspark(variants[name], target=target, target_name="tiny", name=name)
    kw = VARIANTS[name]
    assert net.args.markov_rank == kw.get("rank", 8)
    assert net.args.first_slot == (0 if kw.get("anchor_first", True) else 1)
    if net.args.confidence and kw.get("conf_bias", True):
        assert net.conf_b.item() == 0.5  # the optional bias was read
    if net.args.markov_kind == "rnn":
        assert net.joint_w.shape == (24, 16 + 64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"drop": "markov_head.markov_w2.weight"}, "lacks markov_head.markov_w2.weight"),
        ({"drop": "layers.1.mlp.up_proj.weight"}, "lacks layers.1.mlp.up_proj.weight"),
        ({"kind": "gated", "drop": "markov_head.gate_proj.bias"}, "lacks markov_head.gate_proj"),
        ({"reshape": ("markov_head.markov_w1.weight", (TINY_VOCAB, 4))}, r"shape \(320, 4\)"),
        ({"reshape": ("confidence_head.proj.weight", (1, 64))}, r"expected \(1, 72\)"),
        ({"reshape": ("embed_tokens.weight", (100, 64))}, "but the target's is"),
        ({"edit": {"target_layer_ids": [1, 9]}}, r"target layer ids \[9\] outside"),
        ({"edit": {"num_target_layers": 36}}, "built for 36 target layers"),
        ({"edit": {"mask_token_id": 4000}}, "mask token 4000 outside"),
        ({"vocab": 100}, "vocabulary 100 vs 320"),
    ],
)
def test_malformed_checkpoints_fail_clearly(target, tmp_path, kwargs, message):
    path = save_tiny_dspark(tmp_path / "bad", **kwargs)
    with pytest.raises(CheckpointError, match=message):
        load_dspark(path, target=target, target_name="tiny", name="bad")


def _slots(net, target, anchor=7):
    """Backbone outputs of the draft slots after 13 random context tokens: cached path,
    checked against the slow backbone oracle."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(1, 13, 128, generator=gen)
    cache = net.backbone.new_cache(32)
    net.backbone.extend(cache, features[:, :9])
    net.backbone.extend(cache, features[:, 9:])
    ids = torch.tensor([[anchor] + [TINY_VOCAB - 1] * (net.args.backbone.block_size - 1)])
    block = target.embed_tokens(ids)
    hidden = net.backbone.block_hidden(cache, block)
    torch.testing.assert_close(
        hidden, reference_block_hidden(net.backbone, features, block), atol=2e-5, rtol=1e-5
    )
    slots = hidden[0, net.args.first_slot :]
    return target.head(slots[None])[0], slots


@pytest.mark.parametrize("name", VARIANTS)
def test_greedy_markov_draw_matches_the_oracle_slot_by_slot(target, variants, name):
    net = load_dspark(variants[name], target=target, target_name="tiny", name=name)
    base, slots = _slots(net, target)
    draft = markov_draw(net, base, slots, 7, SamplingParams(), None)
    tokens = draft.tokens[0].tolist()
    logits, conf = reference_heads(net, base, slots, 7, tokens)
    assert tokens == logits.argmax(-1).tolist()  # each slot's argmax given the previous
    if net.args.markov_rank:
        assert tokens != base.argmax(-1).tolist()  # the Markov head mattered here
    if conf is None:
        assert draft.confidence is None
    else:
        torch.testing.assert_close(draft.confidence[0].double(), conf.sigmoid(), atol=1e-5, rtol=0)


def test_kept_markov_rows_follow_the_ids_and_the_weights(target, variants):
    net = load_dspark(variants["vanilla"], target=target, target_name="tiny", name="vanilla")
    ids = torch.tensor([1, 4, 9])
    with torch.inference_mode():
        first = net.markov_rows(ids)
        assert net.markov_rows(ids) is first  # kept: no gather per slot
        torch.testing.assert_close(first, net.markov_w2[ids], rtol=0, atol=0)
        other = torch.tensor([1, 4, 10])  # other ids, even of the same length
        torch.testing.assert_close(net.markov_rows(other), net.markov_w2[other], rtol=0, atol=0)
    with torch.no_grad():
        net.markov_w2.add_(1.0)  # weights changed in place (say, by training)
    with torch.inference_mode():
        torch.testing.assert_close(net.markov_rows(ids), net.markov_w2[ids], rtol=0, atol=0)
    assert net.markov_rows(ids).requires_grad or not net.markov_w2.requires_grad  # autograd


@pytest.mark.parametrize("name", ["vanilla", "gated", "rnn"])
def test_sampled_markov_draw_reports_the_distribution_it_drew_from(target, variants, name):
    net = load_dspark(variants[name], target=target, target_name="tiny", name=name)
    base, slots = _slots(net, target)
    params = SamplingParams(temperature=0.8, top_k=50, seed=3)
    draft = markov_draw(net, base, slots, 7, params, make_generator(params, torch.device("cpu")))
    tokens = draft.tokens[0].tolist()
    logits, _ = reference_heads(net, base, slots, 7, tokens)
    expected = probabilities(logits.float(), params)
    torch.testing.assert_close(draft.probs[0], expected, atol=2e-5, rtol=1e-4)
    assert all(expected[j, t] > 0 for j, t in enumerate(tokens))


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _dspark(tiny_qwen3_deep, drafter, policy, **kw):
    spec = SpecConfig(method="dspark", drafter=str(drafter), verify_policy=policy, trace=True, **kw)
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)


PROMPTS = ["The quick brown fox", "def add(a, b):", "Speculative decoding drafts tokens"]


@pytest.mark.parametrize("policy", ["full", "cost", "threshold=0.5"])
@pytest.mark.parametrize("name", VARIANTS)
def test_dspark_greedy_equals_ar_under_every_policy(ar, tiny_qwen3_deep, variants, name, policy):
    pipe = _dspark(tiny_qwen3_deep, variants[name], policy)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=24, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=24, session=pipe.new_session())
        assert got.token_ids == want.token_ids
        trace = got.stats.trace
        assert all(0 <= r["accepted"] <= r["verify_length"] <= len(r["draft"]) for r in trace)
        if policy == "full":
            assert all(len(r["draft"]) == r["verify_length"] for r in trace[1:-1])
        if VARIANTS[name].get("confidence", True):
            assert all(len(r.get("confidence", ())) == len(r["draft"]) for r in trace[1:])
        assert got.stats.verify_policy == policy


def test_threshold_policy_cuts_at_the_first_low_confidence(tiny_qwen3_deep, tiny_dspark):
    pipe = _dspark(tiny_qwen3_deep, tiny_dspark, "threshold=0.5")
    out = pipe.generate("The quick brown fox", max_new_tokens=30)
    for r in out.stats.trace[1:]:
        low = [j for j, c in enumerate(r.get("confidence", ())) if c < 0.5]
        assert r["verify_length"] == (low[0] if low else len(r["draft"]))


def test_json_stats_show_the_schedulers_decisions(tiny_qwen3_deep, tiny_dspark):
    pipe = _dspark(tiny_qwen3_deep, tiny_dspark, "cost")
    record = pipe.generate("The quick brown fox", max_new_tokens=20).to_dict()
    stats = record["stats"]
    assert stats["verify_policy"] == "cost"
    assert 0 < stats["mean_confidence"] < 1
    steps = record["trace"]
    assert stats["mean_verify_length"] == pytest.approx(
        sum(r["verify_length"] for r in steps) / len(steps), abs=1e-3
    )


def test_block_size_and_draft_tokens(tiny_qwen3_deep, tiny_dspark):
    pipe = _dspark(tiny_qwen3_deep, tiny_dspark, "full", block_size=4, draft_tokens=3)
    out = pipe.generate("The quick brown fox", max_new_tokens=16)
    assert max(len(r["draft"]) for r in out.stats.trace) == 3
    with pytest.raises(SpecgenError, match="exceeds the block 7"):
        _dspark(tiny_qwen3_deep, tiny_dspark, "full", block_size=8)


def test_drafter_kind_is_read_from_its_config(tiny_qwen3_deep, tiny_dspark):
    spec = SpecConfig(drafter=str(tiny_dspark), verify_policy="full")
    pipe = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32", spec=spec)
    assert pipe.spec.method == "dspark"


def test_a_dspark_drafter_for_another_target_is_refused(tiny_qwen3_deep, tmp_path):
    path = save_tiny_dspark(tmp_path / "other", hidden=32, head_dim=8)
    with pytest.raises(CheckpointError, match="does not fit target"):
        _dspark(tiny_qwen3_deep, path, "full")


@pytest.mark.statistical
@pytest.mark.parametrize(
    "policy,vocab", [("full", False), ("threshold=0.08", False), ("cost", False), ("full", True)]
)
def test_sampling_through_dspark_has_the_target_distribution(
    tiny_qwen3_deep, tiny_dspark, target, policy, vocab, tmp_path
):
    """The 3rd answer token: after the first, one step verifies up to 2 drafts, so it is d2
    (whose proposal depends, through the Markov head, on the sampled d1) or a bonus. The
    threshold and cost policies cut drafts by confidences that depend on the sampled
    anchor and drafts. With a draft vocabulary (half the tokens) drafts come from a
    distribution that is zero elsewhere, and the output is still exact."""
    drafter = tiny_dspark
    if vocab:
        drafter = tmp_path / "vocab"
        shutil.copytree(tiny_dspark, drafter)
        subset = torch.randperm(TINY_VOCAB, generator=torch.Generator().manual_seed(0))
        save_draft_vocab(drafter, subset[: TINY_VOCAB // 2].tolist())
    spec = SpecConfig(method="dspark", drafter=str(drafter), verify_policy=policy)
    # cheap verification: the untrained drafter's low confidences still earn 1-2 slots
    costs = CostTable(contexts=(1,), seconds=(tuple(1.0 + 0.02 * n for n in range(8)),))
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    method = load_method(base.model, spec, base.name)
    pipe = Pipeline(base.model, base.codec, base.name, 64, spec, costs, method)
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(target, prompt, params, 2).float()
    counts = torch.zeros(TINY_VOCAB)
    session, n, verified = pipe.new_session(), 1500, 0
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
        verified += out.stats.verified
    assert verified > n // 4  # drafts were really verified, not all skipped
    assert chi_square_pvalue(counts, exact) > 1e-3
    # the test can tell: the same counts are far from a slightly different distribution
    shifted = exact.roll(1) * 0.1 + exact * 0.9
    assert chi_square_pvalue(counts, shifted) < 1e-6
