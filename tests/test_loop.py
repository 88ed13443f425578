"""The speculative loop against plain decoding: exactness, structure and edges."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig, VerifyPolicy
from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.drafting.base import Drafter
from specgen.engine.ar import generate_ar
from specgen.engine.loop import generate_speculative
from specgen.methods.ngram.drafter import NgramDrafter
from specgen.models.loading import load_target
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import PROBE_AFTER, PROBE_LENGTH, VerifyScheduler
from support.scripted_drafters import OracleDrafter
from support.targets import FAMILIES

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11, 5, 17, 42]
GREEDY = SamplingParams()


class WrongDrafter(OracleDrafter):
    """Proposes the greedy continuation with every third token changed."""

    def propose(self, anchor, max_tokens, params=None, generator=None):
        draft = super().propose(anchor, max_tokens)
        tokens = draft.tokens.clone()
        tokens[:, 2::3] = (tokens[:, 2::3] + 1) % self.model.args.vocab_size
        return Draft(tokens)


@pytest.fixture(scope="module")
def model(tiny_llama):
    return load_target(tiny_llama, dtype=torch.float32, device="cpu")


def _ar(model, n, stop=frozenset(), capacity=128):
    events = generate_ar(
        model, model.new_cache(capacity), PROMPT, params=GREEDY, max_new_tokens=n, stop_ids=stop
    )
    return [t for e in events for t in e.tokens]


def _spec(model, drafter, n, stop=frozenset(), capacity=128, params=GREEDY, scheduler=None):
    cache = model.new_cache(capacity)
    events = list(
        generate_speculative(
            model,
            cache,
            drafter,
            PROMPT,
            params=params,
            max_new_tokens=n,
            stop_ids=stop,
            scheduler=scheduler,
        )
    )
    return [t for e in events for t in e.tokens], events, cache


def test_drafter_equal_to_target_gets_every_draft_accepted(model):
    tokens, events, _ = _spec(model, OracleDrafter(model, 4), 20)
    assert tokens == _ar(model, 20)
    spec_steps = [e for e in events if e.verified]
    assert spec_steps and all(e.accepted == e.verified for e in spec_steps)
    assert all(len(e.tokens) == e.verified + 1 for e in spec_steps)


def test_rejections_still_give_the_greedy_output(model):
    tokens, events, _ = _spec(model, WrongDrafter(model, 5), 24)
    assert tokens == _ar(model, 24)
    assert any(e.accepted < e.verified for e in events)


def test_stop_token_inside_an_accepted_run(model):
    free = _ar(model, 20)
    stop_at = 6  # well inside a fully accepted block of 4
    stop = frozenset({free[stop_at]})
    first = free.index(free[stop_at])
    tokens, events, cache = _spec(model, OracleDrafter(model, 4), 20, stop=stop)
    assert tokens == free[:first] and events[-1].finish == "stop"
    assert events[-1].accepted > 0  # the stop token was among accepted drafts (or their bonus)


@pytest.mark.parametrize("limit", [1, 2, 6, 7, 11])
def test_max_new_tokens_inside_a_block(model, limit):
    tokens, events, _ = _spec(model, OracleDrafter(model, 4), limit)
    assert tokens == _ar(model, limit) and len(tokens) == limit
    assert events[-1].finish == "length"


def test_context_limit(model):
    capacity = len(PROMPT) + 6
    tokens, events, cache = _spec(model, OracleDrafter(model, 4), 50, capacity=capacity)
    assert events[-1].finish == "context" and cache.free == 0
    assert tokens == _ar(model, 50)[: len(tokens)] and len(tokens) == 7


def test_cache_after_partial_acceptance_equals_a_fresh_prefill(model):
    tokens, events, cache = _spec(model, WrongDrafter(model, 5), 16)
    committed = PROMPT + tokens[:-1]  # the last token is the next anchor: not in the cache
    assert cache.length == len(committed)
    fresh = model.new_cache(128)
    model(torch.tensor([committed]), fresh)
    n = len(committed)
    torch.testing.assert_close(cache.k[:, :, :, :n], fresh.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.v[:, :, :, :n], fresh.v[:, :, :, :n], atol=1e-5, rtol=1e-5)


def test_scheduler_trims_without_changing_the_output(model):
    costs = CostTable(contexts=(16,), seconds=((1.0, 1.1, 1.3, 1.6, 2.0),))
    scheduler = VerifyScheduler(VerifyPolicy(), costs)
    tokens, events, _ = _spec(model, WrongDrafter(model, 4), 30, scheduler=scheduler)
    assert tokens == _ar(model, 30)
    assert all(e.verified <= costs.max_drafts for e in events)


class HopelessDrafter(Drafter):
    """Always drafts `token`; offers itself to the cost scheduler, which then skips it."""

    taps: tuple[int, ...] = ()
    options = (DraftOption(),)
    max_draft_tokens = 4

    def __init__(self, token: int) -> None:
        self.token = token

    def rollback(self, length):
        pass

    def observe(self, tokens, taps):
        pass

    def propose(self, anchor, max_tokens, params=None, generator=None):
        k = min(max_tokens, self.max_draft_tokens)
        return Draft(torch.full((1, k), self.token)) if k else empty_draft()


def test_a_skipping_loop_probes_at_the_scheduler_pace(model):
    """The loop's skipped steps leave the estimates and the run of skips alone, so a
    drafter that never pays is probed 4, 8, 16, 32, 64 ... steps apart, not on a timer."""
    costs = CostTable(contexts=(16,), seconds=((1.0, 1.2, 1.5, 2.4),), drafts={"d": (0.5,)})
    scheduler = VerifyScheduler(VerifyPolicy(), costs)
    free = _ar(model, 160, capacity=256)
    never = min(set(range(model.args.vocab_size)) - set(free))
    tokens, events, _ = _spec(model, HopelessDrafter(never), 160, capacity=256, scheduler=scheduler)
    assert tokens == free
    probes = [i for i, e in enumerate(events) if e.verified]
    assert all(events[i].verified == PROBE_LENGTH for i in probes)
    gaps = [b - a - 1 for a, b in zip(probes[:-1], probes[1:], strict=True)]
    assert probes[0] == 1 + PROBE_AFTER and gaps[:4] == [8, 16, 32, 64], (probes, gaps)


@pytest.mark.parametrize("method", ["ngram", "suffix"])
@pytest.mark.parametrize("family", FAMILIES)
def test_copy_drafters_equal_ar_greedy(tiny_dirs, family, method):
    base = Pipeline.load(str(tiny_dirs[family]), device="cpu", dtype="float32")
    for policy in ("full", "cost", "threshold=0.5"):
        spec = SpecConfig(method=method, verify_policy=policy, draft_tokens=10)
        pipe = Pipeline.load(str(tiny_dirs[family]), device="cpu", dtype="float32", spec=spec)
        for text in ("The quick brown fox jumps over the lazy dog. The quick brown", "def add"):
            want = base.generate(text, raw=True, max_new_tokens=40).token_ids
            got = pipe.generate(text, raw=True, max_new_tokens=40)
            assert got.token_ids == want
            session = pipe.session
            assert session.drafter.context == session.ids  # the drafter mirrors the cache


def test_seeded_sampling_is_reproducible_through_speculation(model):
    params = SamplingParams(temperature=0.9, top_k=50, seed=3)
    a, _, _ = _spec(model, WrongDrafter(model, 3), 20, params=params)
    b, _, _ = _spec(model, WrongDrafter(model, 3), 20, params=params)
    assert a == b


def test_ngram_drafter_in_the_loop_reports_drafts(model):
    drafter = NgramDrafter(draft_tokens=6)
    prompt_loop = PROMPT * 3  # repetitive, so prompt lookup finds matches
    cache = model.new_cache(128)
    events = list(
        generate_speculative(
            model,
            cache,
            drafter,
            prompt_loop,
            params=GREEDY,
            max_new_tokens=30,
            stop_ids=frozenset(),
        )
    )
    assert sum(e.verified for e in events) > 0
    assert all(0 <= e.accepted <= e.verified <= 6 for e in events)


class PricedWrongDrafter(WrongDrafter):
    """WrongDrafter offering itself to the cost scheduler, with a draft time that grows with
    the tokens it drafts, and counting the tokens it was asked for."""

    def __init__(self, model, k):
        super().__init__(model, k)
        self.options = (DraftOption(),)
        self.asked: list[int] = []

    def propose(self, anchor, max_tokens, params=None, generator=None):
        self.asked.append(max_tokens)
        return super().propose(anchor, max_tokens, params, generator)


def test_a_drafter_without_confidences_drafts_only_what_is_verified(model):
    """Its verify length is settled before drafting, so it is asked for exactly that many
    tokens (the scheduler priced each length with its own draft time), and every one of
    them is verified; the output is still AR's."""
    by_length = (0.1, 0.2, 0.3, 0.4)
    costs = CostTable(
        contexts=(16,), seconds=((1.0, 1.05, 1.1, 1.15, 1.2),), drafts={"d": by_length}
    )
    scheduler = VerifyScheduler(VerifyPolicy(), costs)
    drafter = PricedWrongDrafter(model, 4)
    tokens, events, _ = _spec(model, drafter, 40, scheduler=scheduler)
    assert tokens == _ar(model, 40)
    drafted = [e for e in events if e.proposal]
    assert drafted and all(len(e.proposal) == e.verified for e in drafted)
    assert sorted(set(drafter.asked)) != [4]  # not always the whole block
    assert [len(e.proposal) for e in drafted] == [k for k in drafter.asked if k]
