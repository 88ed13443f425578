"""EAGLE-3: the three published layouts, drafts token for token against the slow oracle,
losslessness on the tiny families, and bad input."""

from __future__ import annotations

import pytest
import torch

from oracles.eagle3 import Reference
from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.methods.eagle3.config import Eagle3Args
from support.eagle3 import TARGET_LAYERS, VARIANTS, save_eagle3, save_target
from support.targets import FAMILIES, TINY_VOCAB

PROMPTS = ("The quick brown fox", "def add(a, b):", "Speculative decoding drafts tokens")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("eagle3-target") / "t")


@pytest.fixture(scope="module")
def ar(target_dir):
    return Pipeline.load(str(target_dir), device="cpu", dtype="float32")


def _drafter(tmp_path, target_dir, variant):
    layout, kwargs = VARIANTS[variant]
    kwargs = {**kwargs, "options": dict(kwargs.get("options", {}))}
    return save_eagle3(tmp_path / variant, layout, target=target_dir, **kwargs)


def _pipe(target_dir, drafter, **spec):
    spec = SpecConfig(method="eagle3", drafter=str(drafter), trace=True, **spec)
    return Pipeline.load(str(target_dir), device="cpu", dtype="float32", spec=spec)


def test_taps_are_normalised_to_layer_outputs():
    def taps(cfg):
        return Eagle3Args.from_hf(cfg, num_target_layers=32, name="d").taps

    llama = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4}
    llama.update(num_key_value_heads=2, num_hidden_layers=1, vocab_size=320)
    llama.update(intermediate_size=128, draft_vocab_size=100)
    assert taps(llama) == (1, 15, 28)  # entering 2, 16, 29 (EAGLE, vLLM)
    sglang = {**llama, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]}}
    assert taps(sglang) == (1, 15, 28)  # SGLang's explicit ids: outputs already
    spec = {"speculators_model_type": "eagle3", "transformer_layer_config": llama}
    assert taps(spec) == (1, 15, 28)
    assert taps({**spec, "eagle_aux_hidden_state_layer_ids": [2, 16, 29]}) == (1, 15, 28)
    deep = {**llama, "model_type": "qwen3", "architectures": ["Qwen3Eagle3Model"]}
    assert taps({**deep, "target_layer_ids": [1, 9, 17, 25, 31]}) == (1, 9, 17, 25, 31)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_drafts_equal_the_slow_reference(tmp_path, target_dir, variant):
    """Every draft of a real run (two answers in one session: the second reuses a prefix,
    so the drafter rolls back) equals the oracle's, recomputed from scratch."""
    from transformers import AutoModelForCausalLM

    drafter = _drafter(tmp_path, target_dir, variant)
    pipe = _pipe(target_dir, drafter, verify_policy="full")
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    embed = hf.model.embed_tokens.weight.detach()
    head = hf.lm_head.weight.detach()
    ref = Reference(drafter, TARGET_LAYERS)
    session = pipe.new_session()
    same = total = 0
    for text in ("The quick brown fox", "The quick brown fox jumps over"):
        prompt = pipe.encode(text, raw=True)
        out = pipe.generate(text, raw=True, max_new_tokens=24, session=session)
        committed = list(prompt) + out.stats.trace[0]["committed"]
        for record in out.stats.trace[1:]:
            tokens, anchor = committed[:-1], committed[-1]
            with torch.no_grad():
                states = hf(torch.tensor([tokens]), output_hidden_states=True).hidden_states
            want = ref.draft(states, tokens, anchor, len(record["draft"]), embed, head)
            same += want == record["draft"]
            total += 1
            committed += record["committed"]
    print(f"{variant}: drafts identical {same}/{total}")
    assert total > 20 and same == total


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_ar_on_every_tiny_family(tmp_path, family):
    target = save_target(tmp_path / "t", family)
    drafter = save_eagle3(tmp_path / "d", "specforge")
    ar = Pipeline.load(str(target), device="cpu", dtype="float32")
    pipe = _pipe(target, drafter, verify_policy="full")
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=30, session=pipe.new_session())
        assert got.token_ids == want.token_ids
        assert all(len(r["draft"]) <= 7 for r in got.stats.trace)
        assert sum(r["verify_length"] for r in got.stats.trace[1:]) > 0


@pytest.mark.parametrize("layout", ["speculators", "deepspec"])
def test_cost_scheduler_picks_the_chain_length(tmp_path, target_dir, ar, layout):
    """Under the default cost policy the draft length is the scheduler's; still AR's output."""
    drafter = save_eagle3(tmp_path / layout, layout, target=target_dir)
    pipe = _pipe(target_dir, drafter)
    assert pipe.method.max_draft_tokens == (3 if layout == "speculators" else 7)
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=20, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=20, session=pipe.new_session())
        assert got.token_ids == want.token_ids


@pytest.mark.statistical
def test_sampling_through_eagle3_has_the_target_distribution(tmp_path, target_dir):
    """The second generated token's empirical distribution converges to the exact one."""
    from specgen.models.loading import load_target
    from specgen.verify.sampling import probabilities

    pipe = _pipe(target_dir, save_eagle3(tmp_path / "d", "specforge"), verify_policy="full")
    target = load_target(target_dir, dtype=torch.float32, device="cpu")
    params = SamplingParams(temperature=1.0, top_k=4)
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    first = probabilities(
        target(torch.tensor([prompt]), target.new_cache(32)).logits[0, -1], params
    )
    seconds = torch.tensor([prompt + [x] for x in range(TINY_VOCAB)])
    logits = target(seconds, target.new_cache(32, batch=TINY_VOCAB)).logits[:, -1]
    exact = first @ probabilities(logits, params)
    counts = torch.zeros(TINY_VOCAB)
    session = pipe.new_session()
    n = 1500
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=2, session=session)
        counts[out.token_ids[1]] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    far = 0.5 * (torch.distributions.Dirichlet(torch.ones(TINY_VOCAB)).sample() - exact).abs().sum()
    assert tv < 0.06 and tv < far / 5, (tv, far)


@pytest.mark.parametrize("layout", ["specforge", "speculators", "deepspec"])
def test_drafter_kind_is_read_from_its_config(tmp_path, target_dir, layout):
    drafter = save_eagle3(tmp_path / layout, layout, target=target_dir)
    spec = SpecConfig(drafter=str(drafter), verify_policy="full")  # method left at "ar"
    pipe = Pipeline.load(str(target_dir), device="cpu", dtype="float32", spec=spec)
    assert pipe.spec.method == "eagle3"


def test_safeailab_plain_llama_config_is_recognised(tmp_path, target_dir):
    """SafeAILab's own checkpoints say LlamaForCausalLM; draft_vocab_size marks them."""
    drafter = save_eagle3(tmp_path / "d", "specforge", edit={"architectures": ["LlamaForCausalLM"]})
    spec = SpecConfig(drafter=str(drafter), verify_policy="full")
    pipe = Pipeline.load(str(target_dir), device="cpu", dtype="float32", spec=spec)
    assert pipe.spec.method == "eagle3"


def test_context_follows_the_target_cache(tmp_path, target_dir):
    pipe = _pipe(target_dir, save_eagle3(tmp_path / "d", "deepspec", target=target_dir))
    session = pipe.new_session()
    pipe.generate("The quick brown fox", max_new_tokens=12, session=session)
    assert session.drafter.length == session.cache.length
    assert session.drafter.cache.length < session.cache.length  # entries wait for a draft
    pipe.generate("The quick brown", max_new_tokens=5, session=session)  # prefix reuse
    assert session.drafter.length == session.cache.length


@pytest.mark.parametrize(
    "variant", ["specforge", "speculators-qwen3-2-layers", "deepspec-2-layers"]
)
def test_uneven_commits_and_rollbacks_equal_the_reference(tmp_path, target_dir, variant):
    """The drafter driven directly: committed runs of 1..6 tokens (as steps accepting
    0..5 drafts commit them) and rollbacks, each draft against the oracle."""
    from transformers import AutoModelForCausalLM

    from specgen.models.loading import load_target

    drafter_dir = _drafter(tmp_path, target_dir, variant)
    pipe = _pipe(target_dir, drafter_dir, verify_policy="full")
    target = load_target(target_dir, dtype=torch.float32, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    ref = Reference(drafter_dir, TARGET_LAYERS)
    drafter = pipe.method.new_drafter(64)
    cache = target.new_cache(64)
    seq = torch.randint(0, TINY_VOCAB, (48,), generator=torch.Generator().manual_seed(3))
    same = total = 0
    for size, back in ((9, 0), (1, 0), (3, 0), (6, 2), (2, 0), (5, 0), (4, 7), (1, 0), (6, 0)):
        if back:  # the target forgets its last `back` tokens; the drafter follows
            cache.rollback(cache.length - back)
            drafter.rollback(cache.length)
        start = cache.length
        chunk = seq[start : start + size]
        out = target(chunk[None], cache, taps=drafter.taps)
        drafter.observe(chunk.tolist(), out.taps)
        n = cache.length
        k = drafter.max_draft_tokens
        got = drafter.propose(int(seq[n]), k).tokens[0].tolist()
        with torch.no_grad():
            states = hf(seq[None, :n], output_hidden_states=True).hidden_states
        embed, head = hf.model.embed_tokens.weight, hf.lm_head.weight
        want = ref.draft(states, seq[:n].tolist(), int(seq[n]), k, embed, head)
        same += got == want
        total += 1
    print(f"{variant} (uneven commits): drafts identical {same}/{total}")
    assert same == total


def _real(name):
    import json

    from support.targets import FIXTURES

    return json.loads((FIXTURES / name).read_text())


def _public_config(layout, size):
    """Published-shape configs, assembled from the layouts' config code (SpecForge's
    `configs/qwen3-8b-eagle3.json` fields, speculators' `Eagle3SpeculatorConfig`, DeepSpec's
    `build_draft_config` over the target's own config)."""
    target = _real(f"qwen3-{size}.config.json")
    layer = {k: target[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
    layer.update({k: target[k] for k in ("num_key_value_heads", "head_dim", "vocab_size")})
    layer.update(rms_norm_eps=1e-6, rope_theta=1000000, num_hidden_layers=1)
    if layout == "specforge":
        return {**layer, "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                "draft_vocab_size": 32000, "max_position_embeddings": 40960}  # fmt: skip
    if layout == "speculators":
        return {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "transformer_layer_config": {**layer, "model_type": "qwen3"},
            "draft_vocab_size": 32000,
            "norm_before_residual": True,
            "speculators_config": {"proposal_methods": [{"speculative_tokens": 3}]},
        }
    return {**target, "architectures": ["Qwen3Eagle3Model"], "num_hidden_layers": 1,
            "num_target_layers": target["num_hidden_layers"], "ttt_length": 7,
            "target_layer_ids": [1, 9, 17, 25, 33], "draft_num_hidden_layers": 1}  # fmt: skip


@pytest.mark.parametrize("layout", ["specforge", "speculators", "deepspec"])
@pytest.mark.parametrize("size", ["4b", "8b"])
def test_public_shaped_configs_pair_with_their_targets(layout, size):
    from specgen.core.errors import CheckpointError
    from specgen.methods.eagle3.config import check_pair
    from specgen.models.families import model_args

    target = model_args(_real(f"qwen3-{size}.config.json"))
    args = Eagle3Args.from_hf(_public_config(layout, size), num_target_layers=36, name="d")
    assert args.layers.num_layers == 1 and args.layers.hidden_size == target.hidden_size
    assert args.taps == ((1, 9, 17, 25, 33) if layout == "deepspec" else (1, 17, 32))
    assert args.layers.qk_norm == (layout != "specforge")
    vocab = target.vocab_size
    used = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))[: args.draft_vocab]
    d2t = None if layout == "deepspec" else used.sort().values - torch.arange(args.draft_vocab)
    fc = (target.hidden_size, len(args.taps) * target.hidden_size)
    head = (vocab, target.hidden_size) if layout == "deepspec" else None
    ids = check_pair(args, target, "d", "t", d2t=d2t, t2d=None, fc=fc, head=head)
    assert ids.shape == (args.draft_vocab,)
    other = model_args(_real(f"qwen3-{'8b' if size == '4b' else '4b'}.config.json"))
    with pytest.raises(CheckpointError, match="drafter d does not fit target T: hidden size"):
        check_pair(args, other, "d", "T", d2t=d2t, t2d=None, fc=fc, head=head)
