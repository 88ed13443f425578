"""The device-resident speculative loop (engine/resident.py) against the sync loop and AR.

On the CPU every op finishes before it returns, so nothing here is about speed: these are
the loop's decisions and results, which must be the sync loop's (every draft verified
whole: event for event, even seeded sampling) or at least the target's own output (the
cost scheduler, deciding a step later). The CUDA run is in tests/test_gpu.py.
"""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams, SpecConfig, VerifyPolicy
from specgen.core.draft import DraftOption
from specgen.engine.ar import generate_ar
from specgen.engine.loop import generate_speculative
from specgen.engine.resident import generate_resident
from specgen.models.loading import load_target
from specgen.scheduling.cost import CostTable
from specgen.scheduling.scheduler import VerifyScheduler
from support.scripted_drafters import AnswerKeyDrafter

PROMPT = [5, 17, 42, 99, 7, 3, 250, 11, 5, 17, 42]
GREEDY = SamplingParams()


class PricedAnswerKey(AnswerKeyDrafter):
    options = (DraftOption(),)


@pytest.fixture(scope="module")
def model(tiny_llama):
    return load_target(tiny_llama, dtype=torch.float32, device="cpu")


def _ar(model, n, capacity=128, stop=frozenset()):
    cache = model.new_cache(capacity)
    events = generate_ar(model, cache, PROMPT, params=GREEDY, max_new_tokens=n, stop_ids=stop)
    return [t for e in events for t in e.tokens]


def _run(loop, model, drafter, n, *, capacity=128, stop=frozenset(), params=GREEDY, **kw):
    cache = model.new_cache(capacity)
    events = list(
        loop(model, cache, drafter, PROMPT, params=params, max_new_tokens=n, stop_ids=stop, **kw)
    )
    return events, cache


def _both(model, make_drafter, n, **kw):
    sync, sync_cache = _run(generate_speculative, model, make_drafter(), n, **kw)
    resident, resident_cache = _run(generate_resident, model, make_drafter(), n, **kw)
    return sync, sync_cache, resident, resident_cache


def _same_cache(a, b):
    assert a.length == b.length
    n = a.length
    torch.testing.assert_close(a.k[:, :, :, :n], b.k[:, :, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a.v[:, :, :, :n], b.v[:, :, :, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("wrong", [0, 3, 1])  # all accepted, some rejected, none accepted
@pytest.mark.parametrize("limit", [1, 2, 7, 11, 40])
def test_every_step_is_the_sync_loops(model, wrong, limit):
    key = PROMPT + _ar(model, 60)
    sync, sync_cache, resident, resident_cache = _both(
        model, lambda: AnswerKeyDrafter(key, 4, wrong), limit
    )
    assert resident == sync  # tokens, verify lengths, accept counts, finish, proposals
    assert [t for e in resident for t in e.tokens] == _ar(model, limit)
    _same_cache(resident_cache, sync_cache)


def test_a_stop_token_found_a_step_late_cuts_exactly(model):
    free = _ar(model, 40)
    stop = frozenset({free[9]})
    key = PROMPT + free
    sync, sync_cache, resident, resident_cache = _both(
        model, lambda: AnswerKeyDrafter(key, 4), 40, stop=stop
    )
    assert resident == sync and resident[-1].finish == "stop"
    assert [t for e in resident for t in e.tokens] == free[: free.index(free[9])]
    _same_cache(resident_cache, sync_cache)  # the step in flight left nothing behind


def test_the_context_limit_ends_as_in_the_sync_loop(model):
    key = PROMPT + _ar(model, 60)
    capacity = len(PROMPT) + 13
    sync, sync_cache, resident, resident_cache = _both(
        model, lambda: AnswerKeyDrafter(key, 4), 50, capacity=capacity
    )
    assert resident == sync and resident[-1].finish == "context" and resident_cache.free == 0
    _same_cache(resident_cache, sync_cache)


def test_seeded_sampling_draws_as_the_sync_loop(model):
    params = SamplingParams(temperature=0.9, top_k=50, seed=3)
    key = PROMPT + _ar(model, 60)
    sync, _, resident, _ = _both(model, lambda: AnswerKeyDrafter(key, 3, 2), 30, params=params)
    assert resident == sync


def test_the_host_learns_each_steps_length_a_step_late(model):
    """The drafter is told every committed length once, in order, after the step."""
    key = PROMPT + _ar(model, 60)
    drafter = AnswerKeyDrafter(key, 4, 3)
    events, cache = _run(generate_resident, model, drafter, 30)
    lengths = [len(PROMPT)]
    for e in events[1:]:
        lengths.append(lengths[-1] + e.accepted + 1)
    assert drafter.assumed[:-1] == lengths[1:] and drafter.assumed[-1] == cache.length
    # steps were queued before the host knew where the step before them ended
    ahead = [start for start, known in drafter.drafted_at if start > known]
    assert len(ahead) >= len(events) // 2


def test_the_cost_scheduler_deciding_a_step_late_keeps_the_output(model):
    key = PROMPT + _ar(model, 120, capacity=256)
    costs = CostTable(contexts=(16,), seconds=((1.0, 1.1, 1.3, 1.6, 2.0),), drafts={"d": (0.2,)})
    for wrong in (0, 2, 1):
        scheduler = VerifyScheduler(VerifyPolicy(), costs)
        drafter = PricedAnswerKey(key, 4, wrong)
        events, _ = _run(generate_resident, model, drafter, 120, capacity=256, scheduler=scheduler)
        assert [t for e in events for t in e.tokens] == key[len(PROMPT) :]
        assert scheduler.probes.out <= 1  # never two probes in flight


def test_closing_the_stream_leaves_the_caches_at_what_was_handed_over(model):
    key = PROMPT + _ar(model, 60)
    drafter = AnswerKeyDrafter(key, 4)
    cache = model.new_cache(128)
    events = generate_resident(
        model, cache, drafter, PROMPT, params=GREEDY, max_new_tokens=40, stop_ids=frozenset()
    )
    handed = [next(events) for _ in range(3)]  # step 3 is computed, step 4 in flight
    events.close()  # Ctrl-C, or a caller that stops reading
    committed = len(PROMPT) + sum(e.accepted + 1 for e in handed[1:])
    assert cache.length == committed == drafter.length
    fresh = model.new_cache(128)
    model(torch.tensor([key[:committed]]), fresh)
    _same_cache(cache, fresh)


# --- real drafters through the pipeline -------------------------------------------------


@pytest.fixture
def resident(monkeypatch):
    """Pipelines run speculative steps in the resident loop, as on CUDA (sync engine:
    the loop itself, without the compute thread)."""
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))


def _pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, policy):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    drafter = {
        "dflash": str(tiny_dflash),
        "dspark": str(tiny_dspark),
        "stacked": (str(tiny_dflash), str(tiny_dspark)),
    }[method]
    spec = SpecConfig(method=method, drafter=drafter, verify_policy=policy, engine="sync")
    return ar, ar.with_spec(spec)


def _drafter_contexts(session):
    drafters = getattr(session.drafter, "drafters", [session.drafter])
    return [d.context.ready() for d in drafters]


@pytest.mark.parametrize("method", ["dflash", "dspark", "stacked"])
def test_block_drafters_in_the_resident_loop_match_the_sync_loop(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, monkeypatch
):
    ar, pipe = _pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, "full")
    sync_session = pipe.new_session()
    prompts = ("The quick brown fox", "one two one two one two")  # the second: a chat turn
    sync = [pipe.generate(p, max_new_tokens=30, session=sync_session) for p in prompts]
    sampled = SamplingParams(temperature=0.9, top_k=20, seed=4)
    sync_sampled = pipe.generate("def add(a, b):", sampling=sampled, max_new_tokens=20)
    monkeypatch.setattr(Pipeline, "resident_steps", property(lambda self: True))
    session = pipe.new_session()
    got = [pipe.generate(p, max_new_tokens=30, session=session) for p in prompts]
    for want, have, prompt in zip(sync, got, prompts, strict=True):
        assert have.token_ids == want.token_ids
        assert have.token_ids == ar.generate(prompt, max_new_tokens=30).token_ids
        assert have.stats.acceptance_length == want.stats.acceptance_length
    assert session.ids == sync_session.ids
    _same_cache(session.cache, sync_session.cache)
    # the drafters' contexts, written at device positions, hold what eager appends hold
    contexts = zip(_drafter_contexts(session), _drafter_contexts(sync_session), strict=True)
    for mine, theirs in contexts:
        _same_cache(mine, theirs)
    resampled = pipe.generate("def add(a, b):", sampling=sampled, max_new_tokens=20)
    if method != "stacked":  # stacked's selector learns a step late: its picks may differ
        assert resampled.token_ids == sync_sampled.token_ids


@pytest.mark.parametrize("method", ["dspark", "stacked"])
def test_the_cost_policy_in_the_resident_loop_is_exact(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, resident
):
    ar, pipe = _pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, "cost")
    for prompt in ("The quick brown fox", "def add(a, b):"):
        want = ar.generate(prompt, max_new_tokens=40).token_ids
        assert pipe.generate(prompt, max_new_tokens=40).token_ids == want


def test_an_interrupted_resident_answer_continues_as_a_chat(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, resident
):
    ar, pipe = _pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, "dflash", "full")
    session = pipe.new_session()
    stream = pipe.stream("The quick brown fox", max_new_tokens=40, session=session)
    next(stream), next(stream)
    stream.close()  # Ctrl-C after two steps
    assert len(session.ids) == session.cache.length
    assert session.drafter.context.length == session.cache.length
    follow = "one two one two"
    want = ar.generate(follow, max_new_tokens=20, session=ar.new_session()).token_ids
    assert pipe.generate(follow, max_new_tokens=20, session=session).token_ids == want


@pytest.mark.statistical
@pytest.mark.parametrize("method,policy", [("dspark", "cost"), ("stacked", "full")])
def test_sampling_in_the_resident_loop_has_the_target_distribution(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, policy, resident
):
    """The 5th answer token, which a second or third step makes: DSpark's verify lengths
    then come from its previous draft's confidences, and stacked's drafter from a
    selector that learns a step late; neither may bend the distribution."""
    from support.statistics import chi_square_pvalue, exact_token_distribution
    from support.targets import TINY_VOCAB

    _, loaded = _pipes(tiny_qwen3_deep, tiny_dflash, tiny_dspark, method, policy)
    # cheap verification: the untrained drafters' low estimates still earn verified slots
    steps = (tuple(1.0 + 0.02 * n for n in range(8)),)  # free drafts
    costs = CostTable(contexts=(1,), seconds=steps, drafts={n: (0.0,) for n in loaded.drafters})
    pipe = Pipeline(loaded.model, loaded.codec, loaded.name, 64, loaded.spec, costs, loaded.method)
    text = "The quick brown fox"
    params = SamplingParams(temperature=1.0, top_k=3)
    exact = exact_token_distribution(pipe.model, pipe.encode(text, raw=True), params, 4)
    counts, session, n, verified = torch.zeros(TINY_VOCAB), pipe.new_session(), 1500, 0
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=3, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=8, session=session)
        counts[out.token_ids[4]] += 1
        verified += out.stats.verified
    assert verified > n  # drafts were really verified
    assert chi_square_pvalue(counts, exact.float()) > 1e-3
    shifted = exact.float().roll(1) * 0.25 + exact.float() * 0.75  # the test can tell
    assert chi_square_pvalue(counts, shifted) < 1e-6
