"""EAGLE-3 wherever the other drafters run: its fixed-shape chain (a CUDA graph per length
on CUDA) drafts what the eager chain does, greedy and sampled seed for seed; driven from
device state with any acceptance it drafts what the float64 oracle drafts; the
device-resident loop makes the sync loop's steps, alone and in `stacked`; a sampled chain
hands the verifier the distributions it drew from. The CUDA runs are in test_gpu_eagle3.py."""

from __future__ import annotations

import pytest
import torch

from oracles.eagle3 import Reference
from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.methods.eagle3.drafter import CHAINS
from specgen.methods.stacked.drafter import StackedDrafter
from specgen.verify.sampling import probabilities
from support.eagle3 import TARGET_LAYERS, VARIANTS, save_eagle3, save_target
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB

PROMPTS = ("The quick brown fox", "one two one two one two")  # the second: a chat turn
SAMPLED = SamplingParams(temperature=1.5, top_k=100, seed=4)  # broad: drafts are accepted
# the layouts' paths: a draft vocabulary (d2t), a plain later layer, every layer fused
ENGINE_VARIANTS = ["specforge", "speculators-qwen3-2-layers", "deepspec-2-layers"]


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("eagle3-target") / "t")


@pytest.fixture(scope="module")
def ar(target_dir):
    return Pipeline.load(str(target_dir), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def drafters(tmp_path_factory, target_dir):
    root = tmp_path_factory.mktemp("eagle3-drafters")
    out = {}
    for variant in ENGINE_VARIANTS:
        layout, kwargs = VARIANTS[variant]
        kwargs = {**kwargs, "options": dict(kwargs.get("options", {}))}
        out[variant] = save_eagle3(root / variant, layout, target=target_dir, **kwargs)
    return out


@pytest.fixture
def resident(monkeypatch):
    """Pipelines run speculative steps in the resident loop, as on CUDA."""
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))


def _pipe(ar, drafter, **kw):
    spec = SpecConfig(method="eagle3", drafter=str(drafter), verify_policy="full", **kw)
    return ar.with_spec(spec)


def _drafts(result):
    return [r["draft"] for r in result.stats.trace]


def _same_entries(mine, theirs):
    """Two EAGLE-3 drafters follow the same tokens with the same committed entries."""
    assert mine.length == theirs.length
    for d in (mine, theirs):
        d._settle()  # entries still waiting for a draft (the sync loop's) are run now
    assert mine.cache.length == theirs.cache.length == mine.length - 1
    n = mine.cache.length
    for a, b in ((mine.cache.k, theirs.cache.k), (mine.cache.v, theirs.cache.v)):
        torch.testing.assert_close(a[..., :n, :], b[..., :n, :], atol=1e-5, rtol=1e-5)
    # the target's features themselves differ in the last digits (its verify step attends
    # under a device-built mask in the resident loop), and fc sums 3-5 of them
    n = mine.length
    torch.testing.assert_close(mine.fused[:, :n], theirs.fused[:, :n], atol=1e-4, rtol=1e-4)
    assert torch.equal(mine.ids[:, : mine.length], theirs.ids[:, : mine.length])


@pytest.mark.parametrize("variant", ["specforge", "speculators-qwen3-2-layers"])
def test_the_fixed_shape_chain_drafts_what_the_eager_one_does(ar, drafters, variant):
    pipe = _pipe(ar, drafters[variant], trace=True)
    assert not pipe.method.cuda_graphs  # CPU: eager
    eager, static = pipe.new_session(), pipe.new_session()
    static.drafter.steps = static.drafter.steps.uncaptured()
    for prompt in PROMPTS:
        want = pipe.generate(prompt, max_new_tokens=30, session=eager)
        got = pipe.generate(prompt, max_new_tokens=30, session=static)
        assert got.token_ids == want.token_ids
        assert _drafts(got) == _drafts(want)
    for seed, temperature in ((1, 0.8), (2, 1.3)):
        params = SamplingParams(temperature=temperature, top_k=30, seed=seed)
        kw = dict(sampling=params, max_new_tokens=24)
        want = pipe.generate("The quick brown fox", session=eager, **kw)
        got = pipe.generate("The quick brown fox", session=static, **kw)
        assert got.token_ids == want.token_ids
        assert _drafts(got) == _drafts(want)
    # the fixed-shape chains drafted: one per length and sampling setting
    settings = {setting for _, setting in static.drafter.steps.step(CHAINS)._steps}
    assert settings == {None, (0.8, 30, 1.0), (1.3, 30, 1.0)}
    _same_entries(static.drafter, eager.drafter)


@pytest.mark.parametrize("variant", ENGINE_VARIANTS)
def test_resident_steps_with_any_acceptance_equal_the_reference(ar, target_dir, drafters, variant):
    """The resident protocol driven directly: each verified block has its first `a` drafts
    right and the rest wrong, the host learns the length a step later, chains of several
    lengths; every draft against the oracle recomputed from scratch in float64."""
    from transformers import AutoModelForCausalLM

    pipe = _pipe(ar, drafters[variant])
    model = pipe.model
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    embed, head = hf.model.embed_tokens.weight, hf.lm_head.weight
    ref = Reference(drafters[variant], TARGET_LAYERS)
    drafter = pipe.method.new_drafter(96)
    cache = model.new_cache(96)
    seq = torch.randint(0, TINY_VOCAB, (80,), generator=torch.Generator().manual_seed(7))
    prompt = seq[:9]
    out = model(prompt[None], cache, taps=drafter.taps)
    drafter.observe(prompt.tolist(), out.taps)
    cache.make_finite()  # as the resident loop does: masked attention reads dead positions
    drafter.begin_resident()
    start, same, total = 9, 0, 0
    # (drafts verified, drafts accepted, chain length drafted)
    steps = [(4, 4, 7), (3, 0, 3), (6, 2, 7), (1, 1, 1), (0, 0, 2), (5, 3, 5), (2, 2, 7), (7, 7, 4)]
    for verified, accepted, k in steps:
        start_t = torch.tensor([start])
        anchor = int(seq[start])
        got = drafter.draft_at(torch.tensor([[anchor]]), start_t, k).tokens[0].tolist()
        with torch.no_grad():
            states = hf(seq[None, :start], output_hidden_states=True).hidden_states
        want = ref.draft(states, seq[:start].tolist(), anchor, k, embed, head)
        same += got == want
        total += 1
        block = seq[start : start + 1 + verified].clone()
        block[1 + accepted :] = (block[1 + accepted :] + 1) % TINY_VOCAB  # rejected drafts
        out = model.forward_static(block[None], cache, start_t, taps=drafter.taps)
        drafter.observe_at(block[None], out.taps, start_t)
        start += accepted + 1
        cache.assume_written(start)
        drafter.assume(start)
    print(f"{variant} (resident steps): drafts identical {same}/{total}")
    assert same == total


@pytest.mark.parametrize("variant", ENGINE_VARIANTS)
def test_the_resident_loop_matches_the_sync_loop(ar, drafters, variant, monkeypatch):
    pipe = _pipe(ar, drafters[variant], engine="sync")
    sync_session = pipe.new_session()
    sync = [pipe.generate(p, max_new_tokens=30, session=sync_session) for p in PROMPTS]
    sync_sampled = [
        pipe.generate(p, sampling=SAMPLED, max_new_tokens=24, session=sync_session) for p in PROMPTS
    ]
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    session = pipe.new_session()
    for want, prompt in zip(sync, PROMPTS, strict=True):
        got = pipe.generate(prompt, max_new_tokens=30, session=session)
        assert got.token_ids == want.token_ids
        assert got.token_ids == ar.generate(prompt, max_new_tokens=30).token_ids
        assert got.stats.acceptance_length == want.stats.acceptance_length
    accepted = 0
    for want, prompt in zip(sync_sampled, PROMPTS, strict=True):
        got = pipe.generate(prompt, sampling=SAMPLED, max_new_tokens=24, session=session)
        assert got.token_ids == want.token_ids
        assert got.stats.acceptance_length == want.stats.acceptance_length
        accepted += got.stats.accepted
    assert accepted > 0  # sampled drafts were accepted: partial steps were exercised
    assert session.ids == sync_session.ids
    _same_entries(session.drafter, sync_session.drafter)


def test_stacked_with_eagle3_in_the_resident_loop(
    tiny_qwen3_deep, tiny_dflash, tmp_path, monkeypatch
):
    """DFlash and EAGLE-3 taking turns in the resident loop make the sync loop's steps (the
    turns forced alike in both), greedy and seeded; EAGLE-3's entries follow every step."""
    eagle3 = save_eagle3(tmp_path / "eagle3", "specforge", taps=[1, 3, 5])
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    spec = SpecConfig(
        method="stacked", drafter=(str(tiny_dflash), str(eagle3)), verify_policy="full",
        trace=True, engine="sync",
    )  # fmt: skip
    pipe = ar.with_spec(spec)
    assert pipe.new_session().drafter.resident

    def turns(name):
        original = getattr(StackedDrafter, name)

        def every_other(self, anchor, *args):
            self.turn = getattr(self, "turn", -1) + 1
            self.select(self.turn % 2)
            return original(self, anchor, *args)

        monkeypatch.setattr(StackedDrafter, name, every_other)

    turns("propose")
    turns("draft_at")
    runs = {}
    for engine in ("sync", "resident"):
        if engine == "resident":
            monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
        session = pipe.new_session()
        results = [pipe.generate(p, max_new_tokens=30, session=session) for p in PROMPTS]
        sampled = pipe.new_session()  # its own drafter: the turns start alike
        results.append(
            pipe.generate(PROMPTS[0], sampling=SAMPLED, max_new_tokens=24, session=sampled)
        )
        runs[engine] = (results, session)
    for want, got in zip(*(runs[e][0] for e in ("sync", "resident")), strict=True):
        assert got.token_ids == want.token_ids
        assert [(r["drafter"], r["draft"]) for r in got.stats.trace] == [
            (r["drafter"], r["draft"]) for r in want.stats.trace
        ]
    for prompt, got in zip(PROMPTS, runs["resident"][0][:2], strict=True):
        assert got.token_ids == ar.generate(prompt, max_new_tokens=30).token_ids
        assert {"dflash", "eagle3"} <= {r["drafter"] for r in got.stats.trace[1:]}
    (_, eagle_sync), (_, eagle_resident) = (runs[e][1].drafter.drafters for e in runs)
    _same_entries(eagle_sync, eagle_resident)


def test_an_interrupted_resident_answer_continues_as_a_chat(ar, drafters, resident):
    pipe = _pipe(ar, drafters["deepspec-2-layers"])
    session = pipe.new_session()
    stream = pipe.stream("The quick brown fox", max_new_tokens=40, session=session)
    next(stream), next(stream)
    stream.close()  # Ctrl-C after two steps
    assert len(session.ids) == session.cache.length == session.drafter.length
    follow = "one two one two"
    want = ar.generate(follow, max_new_tokens=20, session=ar.new_session()).token_ids
    assert pipe.generate(follow, max_new_tokens=20, session=session).token_ids == want


# --- sampled chains ----------------------------------------------------------------------


def _context(pipe, drafter, text="The quick brown fox"):
    """`drafter` after the prompt's tokens, and the prompt's last token as the anchor."""
    ids = pipe.encode(text, raw=True)
    cache = pipe.model.new_cache(64)
    out = pipe.model(torch.tensor([ids[:-1]]), cache, taps=drafter.taps)
    drafter.observe(ids[:-1], out.taps)
    return ids


@pytest.mark.parametrize("variant", ["specforge", "deepspec-2-layers"])
def test_a_sampled_chain_hands_over_the_distributions_it_drew_from(
    ar, target_dir, drafters, variant
):
    """Every position's q is the request's filters over the oracle's logits of the chain
    actually drawn (a draft vocabulary's q is 0 off it); the drafts differ by seed."""
    from transformers import AutoModelForCausalLM

    pipe = _pipe(ar, drafters[variant])
    hf = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float64).eval()
    embed, head = hf.model.embed_tokens.weight, hf.lm_head.weight
    ref = Reference(drafters[variant], TARGET_LAYERS)
    drafter = pipe.method.new_drafter(64)
    ids = _context(pipe, drafter)
    with torch.no_grad():
        states = hf(torch.tensor([ids[:-1]]), output_hidden_states=True).hidden_states
    used = drafter.net.to_target
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.95)
    chains = set()
    for seed in range(6):
        generator = torch.Generator().manual_seed(seed)
        draft = drafter.propose(ids[-1], 5, params, generator)
        tokens = draft.tokens[0].tolist()
        chains.add(tuple(tokens))
        _, logits = ref.chain(states, ids[:-1], ids[-1], 5, embed, head, forced=tokens)
        q = draft.probs[0]
        assert q.shape == (5, TINY_VOCAB)
        for j, z in enumerate(logits):
            want = probabilities(z.float()[None], params)[0]
            torch.testing.assert_close(q[j, used], want, atol=2e-5, rtol=1e-4)
            assert q[j].sum().item() == pytest.approx(1.0, abs=1e-5)
            assert q[j, tokens[j]] > 0
        if used.numel() < TINY_VOCAB:
            off = torch.ones(TINY_VOCAB, dtype=torch.bool)
            off[used] = False
            assert (q[:, off] == 0).all()
    assert len(chains) > 1  # sampled, not a point mass


@pytest.mark.statistical
def test_a_sampled_first_draft_is_a_draw_from_its_q(ar, drafters):
    pipe = _pipe(ar, drafters["specforge"])
    drafter = pipe.method.new_drafter(64)
    ids = _context(pipe, drafter)
    params = SamplingParams(temperature=1.5)  # a broad q: many tokens drawn
    counts, q, n = torch.zeros(TINY_VOCAB), None, 3000
    for seed in range(n):
        draft = drafter.propose(ids[-1], 1, params, torch.Generator().manual_seed(seed))
        counts[draft.tokens[0, 0]] += 1
        q = draft.probs[0, 0] if q is None else q
    assert chi_square_pvalue(counts, q) > 1e-3
    assert chi_square_pvalue(counts, q.roll(1) * 0.3 + q * 0.7) < 1e-6  # the test can tell


@pytest.mark.statistical
@pytest.mark.parametrize("engine", ["sync", "resident"])
def test_sampling_through_sampled_chains_has_the_target_distribution(
    ar, drafters, engine, monkeypatch
):
    """The 5th answer token (a third or later step's), with chains drawn at T = 1."""
    from support.statistics import exact_token_distribution

    if engine == "resident":
        monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    pipe = _pipe(ar, drafters["specforge"])
    text = "The quick brown fox"
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, pipe.encode(text, raw=True), params, 4)
    counts, session, n, accepted = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500, 0
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=8, session=session)
        counts[out.token_ids[4]] += 1
        accepted += out.stats.accepted
    print(f"{engine}: {accepted} sampled drafts accepted over {n} answers")
    assert accepted > 0  # sampled drafts were accepted: their q entered the verdicts
    assert chi_square_pvalue(counts, exact.float()) > 1e-3
    shifted = exact.float().roll(1) * 0.25 + exact.float() * 0.75  # the test can tell
    assert chi_square_pvalue(counts, shifted) < 1e-6
