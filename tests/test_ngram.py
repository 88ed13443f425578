"""Prompt lookup: what it proposes, and that its index survives rollbacks."""

from __future__ import annotations

import random

from specgen.methods.ngram.drafter import NgramDrafter


def _drafter(context, k=10):
    drafter = NgramDrafter(draft_tokens=k)
    drafter.observe(context, {})
    return drafter


def _proposal(drafter, anchor, max_tokens=10):
    draft = drafter.propose(anchor, max_tokens)
    return draft.tokens[0].tolist(), draft.bucket


def test_longest_most_recent_match_wins():
    # "1 2 3" occurs twice; the most recent is followed by 7 8 9
    drafter = _drafter([1, 2, 3, 4, 5, 0, 1, 2, 3, 7, 8, 9, 0, 1, 2])
    assert _proposal(drafter, 3) == ([7, 8, 9, 0, 1, 2, 3], 3)


def test_falls_back_to_shorter_ngrams_and_to_nothing():
    drafter = _drafter([9, 4, 5, 6, 1, 2])
    assert _proposal(drafter, 4) == ([5, 6, 1, 2, 4], 1)  # only "4" matches
    assert _proposal(drafter, 42) == ([], 0)


def test_match_ending_at_the_last_context_token():
    drafter = _drafter([3, 3])  # "3 3" then anchor 3: the suffix matches one position back
    assert _proposal(drafter, 3) == ([3], 2)  # n is at most the context length


def test_respects_max_tokens_and_its_own_cap():
    drafter = _drafter(list(range(20)) + [0, 1], k=4)
    assert _proposal(drafter, 2, max_tokens=10)[0] == [3, 4, 5, 6]
    assert _proposal(drafter, 2, max_tokens=2)[0] == [3, 4]
    assert _proposal(drafter, 2, max_tokens=0)[0] == []


def test_rollback_gives_the_same_index_as_a_fresh_drafter():
    rng = random.Random(0)
    tokens = [rng.randrange(8) for _ in range(300)]
    drafter = _drafter(tokens)
    drafter.rollback(170)
    drafter.observe(tokens[170:200], {})
    fresh = _drafter(tokens[:200])
    for anchor in range(8):
        assert _proposal(drafter, anchor) == _proposal(fresh, anchor)
    assert drafter.context == tokens[:200]
