"""Stacked over any set of drafters: three of different kinds (an autoregressive EAGLE-3
one among block drafters) or two of one kind, one verify per step, still AR's output and
the target's distribution; bad sets refused in one line."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.methods.stacked.drafter import StackedDrafter, StackedMethod
from specgen.registry import MODELS
from specgen.scheduling.cost import CostTable
from support.cli import FAST, assert_one_line_error, run
from support.drafters import save_tiny_dflash, save_tiny_dspark
from support.eagle3 import save_eagle3
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB

PROMPTS = ("The quick brown fox", "def add(a, b):", "one two one two one two")
NAMES = ("dflash", "dspark", "eagle3")


@pytest.fixture(scope="module")
def drafters(tmp_path_factory, tiny_dflash):
    """A DFlash, a DSpark and an EAGLE-3 drafter for tiny_qwen3_deep, tapping different
    layers (so one capture serves the union of them)."""
    root = tmp_path_factory.mktemp("mixed")
    dspark = save_tiny_dspark(root / "dspark", target_layer_ids=[0, 2, 4])
    eagle3 = save_eagle3(root / "eagle3", "specforge", taps=[1, 3, 5])
    return (tiny_dflash, dspark, eagle3)


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def _stacked(ar, paths, policy="full", **kw):
    return ar.with_spec(
        SpecConfig(method="stacked", drafter=tuple(map(str, paths)), verify_policy=policy, **kw)
    )


def _priced(pipe, ar, draft=0.1):
    """`pipe` deciding from fixed prices (a GPU's), not this machine's noisy timings."""
    steps = tuple(1.0 + 0.01 * n for n in range(17))
    costs = CostTable((1,), (steps,), {n: (draft,) for n in pipe.drafters})
    return ar.with_spec(pipe.spec, costs=costs)


def _length(drafter) -> int:
    """The committed target tokens a drafter follows (EAGLE-3 keeps its own count)."""
    return drafter.length if hasattr(drafter, "length") else drafter.context.length


@pytest.mark.parametrize("policy", ["cost", "full"])
def test_three_drafters_greedy_equals_ar(ar, drafters, policy):
    pipe = _stacked(ar, drafters, policy, trace=True)
    if policy == "cost":
        pipe = _priced(pipe, ar)
    assert pipe.drafters == NAMES
    session = pipe.new_session()
    assert session.drafter.taps == (0, 1, 2, 3, 4, 5)  # the union of all three
    used = set()
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=40, session=ar.new_session())
        got = pipe.generate(prompt, max_new_tokens=40, session=session)
        assert got.token_ids == want.token_ids
        used |= set(got.stats.by_drafter)
        for d in session.drafter.drafters:  # every context follows the target
            assert _length(d) == session.cache.length
    assert used == set(NAMES)  # each drafted at some point (the scheduler tries each)


def test_each_of_three_drafts_as_if_it_had_drafted_every_step(ar, drafters, monkeypatch):
    """Drafters take turns; in the second run the two not chosen draft too (drafts thrown
    away). A drafter's next proposal must not depend on that: its state (EAGLE-3's own KV
    cache included) may follow the committed tokens only."""
    original = StackedDrafter.propose
    pipe = _stacked(ar, drafters)
    drafts = {}
    for shadow in (False, True):
        log: list[tuple[int, list[int]]] = []

        def propose(self, anchor, max_tokens, params, generator, shadow=shadow, log=log):
            chosen = len(log) % 3
            if shadow:
                for i, d in enumerate(self.drafters):
                    if i != chosen:
                        d.propose(anchor, max_tokens, params, generator)
            self.select(chosen)
            draft = original(self, anchor, max_tokens, params, generator)
            log.append((draft.bucket, draft.tokens[0].tolist()))
            return draft

        monkeypatch.setattr(StackedDrafter, "propose", propose)
        for prompt in PROMPTS:
            want = ar.generate(prompt, max_new_tokens=30, session=ar.new_session())
            got = pipe.generate(prompt, max_new_tokens=30, session=pipe.new_session())
            assert got.token_ids == want.token_ids
        drafts[shadow] = log
    assert {b for b, _ in drafts[False]} == {0, 1, 2}
    assert drafts[True] == drafts[False]


def test_eagle3_drafts_in_stacked_equal_eagle3_alone(ar, drafters, monkeypatch):
    """Chosen every other step, EAGLE-3 proposes what it proposes alone at the same
    committed prefix (its catch-up pass over the tokens it missed changes nothing)."""
    original = StackedDrafter.propose
    pipe = _stacked(ar, drafters, trace=True)
    alone = ar.with_spec(SpecConfig(method="eagle3", drafter=str(drafters[2])))
    calls = []

    def propose(self, anchor, max_tokens, params, generator):
        calls.append(None)
        self.select(2 if len(calls) % 2 else 0)
        return original(self, anchor, max_tokens, params, generator)

    monkeypatch.setattr(StackedDrafter, "propose", propose)
    out = pipe.generate(PROMPTS[0], raw=True, max_new_tokens=30)
    committed = list(pipe.encode(PROMPTS[0], raw=True)) + out.stats.trace[0]["committed"]
    checked = 0
    for record in out.stats.trace[1:]:
        committed_before = list(committed)
        committed += record["committed"]
        if record["drafter"] != "eagle3":
            continue
        drafter = alone.method.new_drafter(256)
        taps = _taps(ar, committed_before[:-1], drafter.taps)
        drafter.observe(committed_before[:-1], taps)
        want = drafter.propose(committed_before[-1], len(record["draft"]))
        assert want.tokens[0].tolist() == record["draft"]
        checked += 1
    assert checked >= 5


def _taps(ar, tokens, layers):
    """The target's hidden states at `layers` over `tokens` (as the pipeline captures them)."""
    model = ar.model
    cache = model.new_cache(len(tokens) + 1)
    out = model(torch.tensor([tokens]), cache, taps=layers)
    return out.taps


def test_two_drafters_of_one_kind_are_named_apart(ar, tiny_dflash, tmp_path):
    other = save_tiny_dflash(tmp_path / "b", target_layer_ids=[2, 4], seed=7)
    pipe = _stacked(ar, (tiny_dflash, other), trace=True)
    assert pipe.drafters == ("dflash-1", "dflash-2")
    for prompt in PROMPTS:
        want = ar.generate(prompt, max_new_tokens=30).token_ids
        assert pipe.generate(prompt, max_new_tokens=30).token_ids == want


def test_registry_stacks_every_drafter_of_an_entry_and_the_copy_drafter():
    qwen = MODELS["qwen3-4b"].drafters
    want = (qwen["dflash"], qwen["dspark"], qwen["eagle3"], "suffix")
    assert StackedMethod.registry_drafter(qwen) == want
    llama = MODELS["llama3.1-8b"].drafters
    assert StackedMethod.registry_drafter(llama) == (llama["dflash"], llama["eagle3"], "suffix")
    one = MODELS["qwen3.5-4b"].drafters  # one learned drafter: stacked with suffix
    assert StackedMethod.registry_drafter(one) == (*one.values(), "suffix")
    assert StackedMethod.registry_drafter({}) is None


def test_bad_sets_are_refused(ar, drafters, tiny_qwen3_deep, tmp_path):
    with pytest.raises(CheckpointError, match="same drafter twice"):
        _stacked(ar, (drafters[2], drafters[0], drafters[2]))
    with pytest.raises(SpecgenError, match="--method stacked takes 2 or more --drafter, got 1"):
        spec = SpecConfig(method="stacked", drafter=str(drafters[2]))
        Pipeline.load(str(tiny_qwen3_deep), device="cpu", spec=spec)
    wide = save_eagle3(tmp_path / "wide", "specforge", taps=[1, 3, 5], edit={"vocab_size": 500})
    with pytest.raises(CheckpointError, match="vocabulary 500 vs 320"):
        _stacked(ar, (drafters[0], wide))


def test_cli_three_drafters_and_bad_input(tiny_qwen3_deep, drafters, tmp_path):
    base = ("generate", "The quick brown fox", "--model", str(tiny_qwen3_deep), *FAST)
    given = [a for d in drafters for a in ("--drafter", str(d))]
    result = run(*base, *given, "-n", "12")
    assert result.exit_code == 0, result.stderr
    twice = ("--drafter", str(drafters[2]), "--drafter", str(drafters[2]))
    assert_one_line_error(run(*base, *given[:2], *twice), 2, "same drafter twice")
    deep = save_eagle3(tmp_path / "deep", "deepspec", target=tiny_qwen3_deep,
                       edit={"hidden_size": 32})  # fmt: skip
    result = run(*base, *given[:4], "--drafter", str(deep))
    assert_one_line_error(result, 2, str(deep), str(tiny_qwen3_deep))


@pytest.mark.statistical
def test_sampling_through_three_drafters_has_the_target_distribution(ar, drafters, monkeypatch):
    from support.statistics import exact_token_distribution

    original = StackedDrafter.propose

    def propose(self, anchor, max_tokens, params, generator):  # each drafter in turn
        self.turn = getattr(self, "turn", -1) + 1
        self.select(self.turn % 3)
        return original(self, anchor, max_tokens, params, generator)

    monkeypatch.setattr(StackedDrafter, "propose", propose)
    pipe = _stacked(ar, drafters)
    text = "The quick brown fox"
    prompt = pipe.encode(text, raw=True)
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, prompt, params, 2).float()
    counts, session, n = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=4, session=session)
        counts[out.token_ids[2]] += 1
    assert chi_square_pvalue(counts, exact) > 1e-3
