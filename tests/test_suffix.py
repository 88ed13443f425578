"""Suffix decoding's search and store: what it drafts, held to a brute-force reference;
that its request context survives rollbacks; and that the store of earlier answers keeps
to its byte budget, forgetting the oldest first."""

from __future__ import annotations

import random
import tracemalloc

import numpy as np
import pytest

from specgen.methods.suffix.drafter import SuffixDrafter, bucket_of
from specgen.methods.suffix.matching import NGRAM, Proposal, propose
from specgen.methods.suffix.store import SuffixStore


def _drafter(context, k=10, store=None, **options):
    drafter = SuffixDrafter(draft_tokens=k, store=store, **options)
    drafter.observe(context, {})
    return drafter


def _draft(drafter, anchor, max_tokens=10):
    return drafter.proposal(anchor, max_tokens)[0]


def test_longest_match_drafts_what_followed_it():
    # "0 1 2 3" occurs once, followed by 7 8 9 0; "1 2 3" also at the start (shorter)
    drafter = _drafter([1, 2, 3, 4, 5, 0, 1, 2, 3, 7, 8, 9, 0, 1, 2])
    found = _draft(drafter, 3)
    assert (found.tokens, found.match, found.probs) == ([7, 8, 9, 0], 4, [1.0] * 4)
    # the draft is at most factor x the match length
    wide = _drafter([1, 2, 3, 4, 5, 0, 1, 2, 3, 7, 8, 9, 0, 1, 2], factor=2.0)
    assert _draft(wide, 3).tokens == [7, 8, 9, 0, 1, 2, 3]  # runs into the anchor, then ends


def test_shorter_matches_nothing_and_the_limits():
    drafter = _drafter([9, 4, 5, 6, 1, 2])
    assert _draft(drafter, 4).tokens == [5]  # only "4" matches: one token
    assert _draft(drafter, 42) == Proposal([], [], 0)
    assert _draft(_drafter([3, 3]), 3).tokens == [3]  # the match one position back
    long = _drafter(list(range(20)) * 2 + list(range(10)), k=4)
    assert _draft(long, 10, max_tokens=10).tokens == [11, 12, 13, 14]  # its own cap
    assert _draft(long, 10, max_tokens=2).tokens == [11, 12]
    assert _draft(long, 10, max_tokens=0).tokens == []


def test_the_most_frequent_continuation_wins_with_its_probability():
    # "5 6" is followed by 7 twice and by 8 once; the newest occurrence is the 8
    context = [5, 6, 7, 1, 5, 6, 7, 2, 5, 6, 8, 3, 0, 5]
    found = _draft(_drafter(context), 6)
    assert found.tokens[0] == 7 and found.probs[0] == pytest.approx(2 / 3)
    # a tie goes to the newest occurrence
    tie = _draft(_drafter([5, 6, 7, 1, 5, 6, 8, 2, 0, 5]), 6)
    assert tie.tokens[0] == 8 and tie.probs[0] == pytest.approx(0.5)
    # below min_prob nothing is drafted
    spread = [x for i in range(6) for x in (5, 6, 10 + i, 0)] + [5]
    assert _draft(_drafter(spread, min_prob=0.25), 6).tokens == []  # 1/5 each
    assert _draft(_drafter(spread, min_prob=0.2), 6).probs == pytest.approx([0.2] * 3)


def _reference(sequences, tail, cap, least=1, now=False):
    """The draft a suffix tree of `sequences` gives (SuffixDecoding's rule), by brute force:
    every match length m, its occurrences' continuations walked by frequency. `now`: the
    last sequence ends with the text itself, whose own occurrence is not counted."""
    best = Proposal([], [], 0)
    for m in range(len(tail), least - 1, -1):
        pattern = tail[:m][::-1]
        follows = []
        for seq in sequences:
            for end in range(m - 1, len(seq) - (now and seq is sequences[-1])):
                if seq[end - m + 1 : end + 1] == pattern:
                    follows.append(seq[end + 1 :])
        if not follows:
            continue
        tokens, probs, prob = [], [], 1.0
        while len(tokens) < min(cap, m) and follows:
            nexts = [f[0] if f else None for f in follows]
            counts = {t: nexts.count(t) for t in nexts if t is not None}
            if not counts:
                break
            top = max(counts.values())
            token = next(t for t in reversed(nexts) if counts.get(t) == top)
            prob *= top / len(follows)
            if prob < 0.1:
                break
            tokens.append(token)
            probs.append(prob)
            follows = [f[1:] for f in follows if f and f[0] == token]
        if tokens and sum(probs) > best.score:
            best = Proposal(tokens, probs, m)
    return best


def test_the_request_search_equals_a_suffix_tree_by_brute_force():
    rng = random.Random(1)
    for trial in range(40):
        vocab = rng.choice([3, 5, 12])
        context = [rng.randrange(vocab) for _ in range(rng.randrange(5, 60))]
        anchor = rng.randrange(vocab)
        got = _draft(_drafter(context, k=8), anchor, 8)
        tail = ([anchor] + context[::-1])[:64]
        # the request's text: context then the anchor (a continuation may run into it)
        want = _reference([context + [anchor]], tail, 8, now=True)
        if got.tokens or want.tokens:  # fewest rows kept may differ only past MAX_ROWS
            assert (got.tokens, got.match) == (want.tokens, want.match), (trial, context, anchor)
            assert got.probs == pytest.approx(want.probs)


def test_the_store_equals_a_suffix_tree_of_the_answers_it_kept():
    rng = random.Random(2)
    store = SuffixStore(2**19, open_tokens=300)
    answers = [[rng.randrange(40) for _ in range(rng.randrange(4, 40))] for _ in range(300)]
    for answer in answers:
        store.add(answer)
    assert len(store.sealed) >= 2  # sealed, merged segments and the open one all searched
    hits = 0
    for trial in range(200):
        source = rng.choice(answers)
        cut = rng.randrange(len(source))
        tail = ([source[cut]] + source[max(0, cut - 6) : cut][::-1])[:64]
        got = propose(store.rows(np.array(tail, dtype=np.int32), 8), 8)
        want = _reference(answers, tail, 8, least=NGRAM)
        assert (got.tokens, got.match) == (want.tokens, want.match), trial
        assert got.probs == pytest.approx(want.probs)
        hits += bool(got.tokens)
        if got.tokens and cut >= 3:
            seen = (source[cut - 3 : cut], source[cut], got)
    assert hits > 50
    # through a drafter whose request holds no match, the store's draft is the one
    context, anchor, want = seen
    found, from_store = _drafter([1000, 1001, 1002] + context, store=store).proposal(anchor, 8)
    assert from_store and found.tokens == want.tokens[: len(found.tokens)] and found.match == 4


def test_rollback_gives_the_same_drafts_as_a_fresh_drafter():
    rng = random.Random(0)
    tokens = [rng.randrange(8) for _ in range(300)]
    drafter = _drafter(tokens)
    drafter.rollback(170)
    drafter.observe(tokens[170:200], {})
    fresh = _drafter(tokens[:200])
    for anchor in range(8):
        assert _draft(drafter, anchor) == _draft(fresh, anchor)
    assert drafter.context == tokens[:200]


def test_buckets_part_match_lengths_branching_and_sources():
    short, long = Proposal([1], [1.0], 2), Proposal([1], [1.0], 30)
    branched = Proposal([1], [0.5], 30)
    buckets = {bucket_of(p, s) for p in (short, long, branched) for s in (False, True)}
    assert len(buckets) == 6


def _fill(store, rng, n, length=200, vocab=30000):
    for _ in range(n):
        store.add([rng.randrange(vocab) for _ in range(length)])


def test_the_store_keeps_to_its_budget_and_forgets_the_oldest_first():
    budget = 400_000
    store = SuffixStore(budget)
    rng = random.Random(3)
    first = [rng.randrange(30000) for _ in range(50)]
    store.add(first)
    tail = np.array(first[:20][::-1], dtype=np.int32)  # the text first[:20], newest first
    assert len(store.rows(tail, 4)) == 1  # found
    for _ in range(60):
        _fill(store, rng, 10)
        assert store.nbytes <= budget
    assert store.dropped > 0 and store.answers < store.added
    assert len(store.rows(tail, 4)) == 0  # the first answer was forgotten
    last = [rng.randrange(30000) for _ in range(50)]
    store.add(last)
    assert len(store.rows(np.array(last[:20][::-1], dtype=np.int32), 4)) == 1  # the newest kept


def test_the_store_counts_the_memory_it_holds():
    """`nbytes` is what the store's arrays hold: tracemalloc sees no more than that (plus
    the Python objects around them), and the budget bounds both."""
    budget = 2_000_000
    rng = random.Random(4)
    answers = [[rng.randrange(30000) for _ in range(300)] for _ in range(400)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        store = SuffixStore(budget)
        for answer in answers:
            store.add(answer)
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.dropped > 0  # it filled and forgot
    assert store.nbytes <= budget
    assert held <= store.nbytes + 64 * 1024 * (1 + len(store.sealed)) // 64  # arrays dominate
    assert held >= 0.9 * store.nbytes  # and nbytes is not an underestimate either
    del answers


def test_a_store_of_no_bytes_keeps_nothing_and_a_negative_one_is_refused():
    store = SuffixStore(0)
    store.add([1, 2, 3, 4, 5])
    assert store.nbytes == 0 and len(store.rows(np.array([3, 2, 1], dtype=np.int32), 4)) == 0
    with pytest.raises(ValueError, match=">= 0 bytes"):
        SuffixStore(-1)
