"""A hybrid target's state after speculation: exactly the state of the committed tokens.

After a verify pass over [anchor, d1..dk] that accepts a drafts, the conv and recurrent
state of every Gated DeltaNet layer must be the state of having processed the committed
tokens alone. The oracle is transformers' model decoding those tokens as plain decoding
would (the prompt prefilled, then one token at a time, its own cache), checked for every
a in 0..k, over many steps, after prefills that end on and around chunk boundaries.
(transformers' chunked prefill of the same tokens drifts 1e-4 from its own token-by-token
decoding over 50 tokens of these models, so it is not the oracle for decoded tokens.)
"""

from __future__ import annotations

import pytest
import torch

from specgen.core.config import SamplingParams
from specgen.core.draft import Draft
from specgen.engine.ar import generate_ar
from specgen.engine.loop import generate_speculative
from specgen.engine.resident import generate_resident
from specgen.models.cache.hybrid import CHECKPOINT_MARGIN
from specgen.models.graphs import GraphedForward
from specgen.models.loading import load_target
from support.scripted_drafters import AnswerKeyDrafter, OracleDrafter
from support.targets import TINY_VOCAB, save_tiny_qwen3_5

# fp32: two implementations of six recurrent layers agree to ~5e-6 of a tensor's scale (the
# conv inputs of the deeper layers, of scale 2-5, to 2e-5); a rejected draft left in a
# state moves it by a large fraction of its scale
RELATIVE = 1e-5
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("q35-state")
    hf = save_tiny_qwen3_5(path, seed=7)
    return hf, load_target(path, dtype=torch.float32, device="cpu")


def ours_state(cache) -> list[torch.Tensor]:
    """Each Gated DeltaNet layer's recurrent state and last K-1 conv inputs at the length."""
    return [x for pair in cache.states() for x in pair]


def reference(hf, ids: list[int], prompt: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """transformers decoding `ids` alone: the first `prompt` prefilled, the rest one at a
    time. Its cache's states (as `ours_state` lists them) and the last token's logits."""
    from transformers import DynamicCache

    cache = DynamicCache(config=hf.config.text_config)
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([ids[:prompt]]), cache=cache).logits
        for token in ids[prompt:]:
            logits = hf(input_ids=torch.tensor([[token]]), cache=cache).logits
    linear = [i for i, t in enumerate(hf.config.text_config.layer_types) if t == "linear_attention"]
    states = []
    for i in linear:  # transformers keeps the last K conv inputs; the next token reads K-1
        states += [cache.layers[i].recurrent_states[0], cache.layers[i].conv_states[0][..., 1:]]
    return states, logits[0, -1]


def reference_state(hf, ids: list[int], prompt: int) -> list[torch.Tensor]:
    return reference(hf, ids, prompt)[0]


def assert_same_state(got, want):
    for ours, theirs in zip(got, want, strict=True):
        scale = max(1.0, theirs.abs().max().item())
        torch.testing.assert_close(ours, theirs, atol=RELATIVE * scale, rtol=1e-4)


def _tokens(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY_VOCAB, (n,), generator=gen).tolist()


@pytest.mark.parametrize("prefill", [5, 63, 64, 65, 128])
@pytest.mark.parametrize("k", [1, 4])
def test_every_acceptance_leaves_the_state_of_the_committed_tokens(pair, prefill, k):
    hf, model = pair
    committed = _tokens(prefill, seed=prefill)
    cache = model.new_cache(512, steps=k + 1)
    model(torch.tensor([committed]), cache, num_logits=1)
    assert_same_state(ours_state(cache), reference_state(hf, committed, prefill))
    draws = iter(_tokens(200, seed=k))
    for step, accepted in enumerate([*range(k + 1), *reversed(range(k + 1)), k, 0, k]):
        start = cache.length
        block = [next(draws) for _ in range(k + 1)]  # [anchor, d1..dk]
        model(torch.tensor([block]), cache)
        cache.rollback(start + 1 + accepted)  # the anchor and the accepted drafts stay
        committed += block[: 1 + accepted]
        assert cache.length == len(committed)
        assert_same_state(ours_state(cache), reference_state(hf, committed, prefill))
        if step % 4 == 3:  # and the next forward reads it: logits as transformers'
            probe = [next(draws)]
            got = model(torch.tensor([probe]), cache).logits[0, -1]
            _, want = reference(hf, committed + probe, prefill)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
            committed += probe


def test_what_can_be_rolled_back_to_and_what_not(pair):
    """The last two steps' lengths (a step writes the generation it does not read), and the
    snapshots a prefill leaves near and at its end; nothing else."""
    _, model = pair
    cache = model.new_cache(256, steps=4)
    model(torch.tensor([_tokens(40, 1)]), cache, num_logits=1)
    assert cache.restorable(40) == 40
    model(torch.tensor([_tokens(4, 2)]), cache)  # a verify step over 40..43
    cache.rollback(42)  # two of its tokens committed
    model(torch.tensor([_tokens(3, 3)]), cache)  # the next, over 42..44
    assert [cache.restorable(n) for n in (45, 44, 42, 41, 40)] == [45, 44, 42, 41, 40]
    model(torch.tensor([_tokens(2, 4)]), cache)  # a third step: the first falls out
    assert cache.restorable(47) == 47 and cache.restorable(45) == 45
    assert cache.restorable(41) == 40  # the prefill's end, a snapshot
    assert cache.restorable(39) == 40 - CHECKPOINT_MARGIN  # the snapshot before its end
    assert cache.restorable(20) == 0
    with pytest.raises(ValueError, match="restorable"):
        cache.rollback(41)


@pytest.mark.parametrize("point", ["end", "margin", "zero"])
def test_rolling_back_to_a_snapshot_is_exact(pair, point):
    hf, model = pair
    prompt = _tokens(50, 3)
    cache = model.new_cache(256, steps=2)
    model(torch.tensor([prompt]), cache, num_logits=1)
    for token in _tokens(8, 4):
        model(torch.tensor([[token]]), cache)
    at = {"end": 50, "margin": 50 - CHECKPOINT_MARGIN, "zero": 0}[point]
    assert cache.restorable(at) == at
    cache.rollback(at)
    assert cache.length == at
    rest = _tokens(12, 5)
    model(torch.tensor([prompt[at:] + rest]), cache, num_logits=1)
    whole = prompt + rest  # prefilled in two pieces here, in one there
    assert_same_state(ours_state(cache), reference_state(hf, whole, len(whole)))


def test_an_interrupted_forward_leaves_the_committed_state(pair, monkeypatch):
    """Ctrl-C inside a forward: nothing it half-wrote is taken for committed state."""
    hf, model = pair
    committed = _tokens(30, 6)
    cache = model.new_cache(128, steps=5)
    model(torch.tensor([committed]), cache, num_logits=1)
    calls = {"n": 0}
    layer = model.layers[4]  # a Gated DeltaNet layer after the attention one
    original = type(layer).forward

    def interrupted(self, *args, **kwargs):
        calls["n"] += 1
        if self is layer:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    for block in ([[1, 2, 3, 4, 5]], [_tokens(40, 8)]):  # a verify block, a prefill
        monkeypatch.setattr(type(layer), "forward", interrupted)
        with pytest.raises(KeyboardInterrupt):
            model(torch.tensor(block), cache)
        monkeypatch.setattr(type(layer), "forward", original)
        cache.rollback(cache.restorable(len(committed)))
        assert cache.length == len(committed)
        assert_same_state(ours_state(cache), reference_state(hf, committed, len(committed)))


class CyclingDrafter(OracleDrafter):
    """The target's greedy continuation with draft j of step s changed, j = s mod (k + 1):
    its steps accept 0, 1, ..., k drafts in turn (k: none changed)."""

    steps = 0

    def propose(self, anchor, max_tokens, params=None, generator=None):
        draft = super().propose(anchor, max_tokens)
        tokens, wrong = draft.tokens.clone(), self.steps % (self.max_draft_tokens + 1)
        self.steps += 1
        if wrong < tokens.shape[1]:
            tokens[0, wrong] = (tokens[0, wrong] + 1) % TINY_VOCAB
        return Draft(tokens)


def _ar(model, prompt, n, stop=frozenset()):
    events = generate_ar(
        model, model.new_cache(256), prompt, params=GREEDY, max_new_tokens=n, stop_ids=stop
    )
    return [t for e in events for t in e.tokens]


def _spec(model, drafter, prompt, n, stop=frozenset(), capacity=256):
    cache = model.new_cache(capacity, steps=1 + drafter.max_draft_tokens)
    events = list(
        generate_speculative(
            model, cache, drafter, prompt, params=GREEDY, max_new_tokens=n, stop_ids=stop
        )
    )
    return [t for e in events for t in e.tokens], events, cache


def test_speculation_on_a_hybrid_target_is_plain_decoding(pair):
    hf, model = pair
    prompt = _tokens(20, 9)
    want = _ar(model, prompt, 30)
    tokens, events, cache = _spec(model, CyclingDrafter(model, 4), prompt, 30)
    assert tokens == want
    assert {e.accepted for e in events if e.verified == 4} == {0, 1, 2, 3, 4}
    committed = prompt + tokens[:-1]  # the last token is the next anchor
    assert_same_state(ours_state(cache), reference_state(hf, committed, len(prompt)))
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=30, do_sample=False)
    assert want == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("limit", [1, 3, 7, 11])
def test_max_new_tokens_and_a_stop_token_inside_a_block(pair, limit):
    hf, model = pair
    prompt = _tokens(12, 10)
    free = _ar(model, prompt, 20)
    tokens, events, cache = _spec(model, OracleDrafter(model, 4), prompt, limit)
    assert tokens == free[:limit] and events[-1].finish == "length"
    stop = frozenset({free[limit]})
    first = free.index(free[limit])
    tokens, events, cache = _spec(model, OracleDrafter(model, 4), prompt, 20, stop=stop)
    assert tokens == free[:first] and events[-1].finish == "stop"
    # the cache may hold accepted drafts past the stop; rolled back to the answer, it is exact
    cache.rollback(cache.restorable(len(prompt) + first))
    assert cache.length == len(prompt) + first
    assert_same_state(ours_state(cache), reference_state(hf, prompt + tokens, len(prompt)))


def test_the_static_step_and_the_resident_loop_on_a_hybrid_target(pair):
    """The graph-capturable forward (slots computed on the device) under the sync loop,
    and the device-resident loop built on it, give the sync loop's tokens and leave the
    state of the committed tokens."""
    hf, model = pair
    prompt = _tokens(16, 11)
    answer = _ar(model, prompt, 24)
    want, _, _ = _spec(model, AnswerKeyDrafter(prompt + answer, 4, wrong=3), prompt, 24)
    assert want == answer
    for loop in (generate_speculative, generate_resident):
        cache = model.new_cache(256, steps=5)
        static = GraphedForward(model, cache, max_tokens=5, capture=False)
        drafter = AnswerKeyDrafter(prompt + answer, 4, wrong=3)
        events = list(
            loop(static, cache, drafter, prompt, params=GREEDY, max_new_tokens=24,
                 stop_ids=frozenset())
        )  # fmt: skip
        got = [t for e in events for t in e.tokens]
        assert got == want, loop.__name__
        assert any(0 < e.accepted < e.verified for e in events)  # partially accepted
        n = cache.restorable(len(prompt) + len(got) - 1)  # the last token: the next anchor
        cache.rollback(n)
        assert n >= len(prompt) + len(got) - 1 - 5
        want_state = reference_state(hf, (prompt + got)[:n], len(prompt))
        assert_same_state(ours_state(cache), want_state)
