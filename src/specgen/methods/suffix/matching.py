"""Where the text so far recurs, and what most often followed it: the search both of
suffix's sources (the request's own tokens, and the store of earlier answers) share.

A source hands over *rows*: for each earlier place where the last tokens of the text so far
(anchor included) occur, how many tokens back the occurrence agrees with it (its match
length, up to `MAX_MATCH`) and the tokens that followed it there (a separator, -1, where
that text ended). Rows are in order of recency, newest last.

The draft is SuffixDecoding's (Oliaro et al. 2024, as Arctic Inference runs it): for a
match length m, the rows matching at least m tokens are the occurrences of the text's last
m tokens, i.e. a node of a suffix tree of the sources, with its count; from it the draft
walks to the most frequent next token again and again, each token's probability estimate
being the product of the frequencies walked (count of the child / count of the node,
occurrences that end there included). It stops below `min_prob`, or after `factor * m`
tokens (a longer match earns a longer draft). Of every match length the draft with the
largest score (the sum of its probabilities) wins, the longer match on a tie.

Everything here is a function of tokens already committed (and earlier answers), never of
the tokens being verified, so a draft is a point mass fixed before verification: exact at
any temperature.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SEPARATOR = -1  # ends a sequence: no match or continuation crosses it
MAX_MATCH = 64  # tokens compared backwards from an occurrence (longer: counted as this)
MAX_ROWS = 32  # occurrences a source hands over (the best matches, newest of those)
NGRAM = 3  # tokens an occurrence must agree on before it is looked at, where any does


@dataclass(frozen=True)
class Rows:
    """Earlier occurrences of the text's end, newest last."""

    match: np.ndarray  # [R] int: tokens each agrees with, backwards from the anchor
    follow: np.ndarray  # [R, L] int32: the tokens after each (SEPARATOR past the end)

    @staticmethod
    def empty(length: int) -> Rows:
        return Rows(np.zeros(0, dtype=np.int64), np.full((0, length), SEPARATOR, np.int32))

    def __len__(self) -> int:
        return len(self.match)

    @staticmethod
    def join(parts: list[Rows], length: int) -> Rows:
        parts = [p for p in parts if len(p)]
        if not parts:
            return Rows.empty(length)
        if len(parts) == 1:
            return parts[0]
        return Rows(
            np.concatenate([p.match for p in parts]), np.concatenate([p.follow for p in parts])
        )


@dataclass(frozen=True)
class Proposal:
    """A draft and how it was found."""

    tokens: list[int]
    probs: list[float]  # each token's estimated probability (products of frequencies)
    match: int  # the match length it was drafted from (0: nothing matched)

    @property
    def score(self) -> float:
        return float(sum(self.probs))


NOTHING = Proposal([], [], 0)


def find(tokens: np.ndarray, size: int, tail: np.ndarray) -> np.ndarray:
    """End positions in `tokens[:size]` (increasing) of the text whose last tokens, newest
    first, are `tail`, by comparing them all: those agreeing on up to `NGRAM` tokens (on
    fewer where none agrees that far), then `deepened`."""
    ends = np.flatnonzero(tokens[:size] == tail[0])
    depth = 1
    while depth < min(NGRAM, len(tail)) and len(ends):
        keep = _agreeing(tokens, ends, tail, depth)
        if len(keep) == 0:
            break
        ends, depth = keep, depth + 1
    return deepened(tokens, ends, tail, depth)


def deepened(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray, depth: int) -> np.ndarray:
    """`ends` (agreeing with `tail` on `depth` tokens) narrowed to those agreeing further,
    while more than `MAX_ROWS` remain: the rows looked at are then the best matches, not
    merely the newest occurrences of a common phrase."""
    while len(ends) > MAX_ROWS and depth < min(MAX_MATCH, len(tail)):
        keep = _agreeing(tokens, ends, tail, depth)
        if len(keep) == 0:
            break
        ends, depth = keep, depth + 1
    return ends


def _agreeing(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray, depth: int) -> np.ndarray:
    back = ends - depth
    return ends[(back >= 0) & (tokens[np.maximum(back, 0)] == tail[depth])]


def rows_at(tokens: np.ndarray, ends: np.ndarray, tail: np.ndarray, length: int) -> Rows:
    """Rows for occurrences ending at `ends` (positions in `tokens`, increasing) of a text
    whose last tokens, newest first, are `tail`; up to `length` tokens after each."""
    ends = ends[-MAX_ROWS:]
    if len(ends) == 0:
        return Rows.empty(length)
    depth = min(MAX_MATCH, len(tail))
    back = ends[:, None] - np.arange(depth)[None, :]  # [R, depth]
    seen = tokens[np.maximum(back, 0)]
    agree = (seen == tail[None, :depth]) & (back >= 0)
    match = np.cumprod(agree, axis=1).sum(axis=1)
    ahead = ends[:, None] + 1 + np.arange(length)[None, :]  # [R, length]
    inside = ahead < len(tokens)
    follow = np.where(inside, tokens[np.minimum(ahead, len(tokens) - 1)], SEPARATOR)
    return Rows(match, follow.astype(np.int32, copy=False))


def propose(rows: Rows, max_tokens: int, *, factor: float = 1.0, min_prob: float = 0.1) -> Proposal:
    """The best-scoring draft over every match length the rows offer (see the module)."""
    if not len(rows) or max_tokens <= 0:
        return NOTHING
    best = NOTHING
    # plain lists: a few dozen short rows are walked faster than numpy calls cost
    matches = rows.match.tolist()
    follows = rows.follow[:, :max_tokens].tolist()
    for m in sorted(set(matches), reverse=True):
        if m <= 0:
            break
        cap = min(max_tokens, int(m * factor + 1e-6))
        if cap <= best.score:  # a score is at most its length: no shorter match can win
            break
        level = [f for f, n in zip(follows, matches, strict=True) if n >= m]
        tokens, probs = _walk(level, cap, min_prob)
        if tokens and sum(probs) > best.score:
            best = Proposal(tokens, probs, m)
    return best


def _walk(rows: list[list[int]], cap: int, min_prob: float) -> tuple[list[int], list[float]]:
    """From the node whose occurrences' continuations are `rows` (newest last), the path
    of most frequent next tokens (the newest occurrence's on a tie)."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    for depth in range(min(cap, len(rows[0]))):
        if len(rows) == 1:  # one occurrence: what followed it, to its end
            for token in rows[0][depth:cap]:
                if token == SEPARATOR:
                    break
                tokens.append(token)
                probs.append(prob)
            break
        column = [r[depth] for r in rows]
        counts: dict[int, int] = {}
        for token in column:
            if token != SEPARATOR:
                counts[token] = counts.get(token, 0) + 1
        if not counts:
            break
        top = max(counts.values())
        token = next(t for t in reversed(column) if counts.get(t) == top)  # newest on a tie
        prob *= top / len(column)  # occurrences that end here count at this node
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        if top < len(column):
            rows = [r for r in rows if r[depth] == token]
    return tokens, probs
