"""The answers a process gave earlier, kept for suffix's drafts within a byte budget.

Answers go one after another into an open segment (a flat token buffer, searched by
comparing every token: it is small); a full one is sealed into a compact index of its
trigrams (sorted keys, where each starts, and their end positions: about 20 bytes a token
against ~100 for a dict of lists) and searched by binary search. The newest sealed segment
absorbs each one sealed after it until it holds an eighth of the budget (re-sorting it
then costs a few milliseconds per answer, amortized), so a lookup visits at most nine
segments and the open one. When the segments together pass the budget, the oldest is
dropped: the earliest answers are forgotten first, an eighth of the budget at a time.
`nbytes` is the store's memory as its arrays hold it (tests hold it to tracemalloc).

Matches from the store start at `NGRAM` tokens: a one- or two-token match among thousands
of earlier answers says little about what comes next.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specgen.methods.suffix.matching import (
    MAX_ROWS,
    NGRAM,
    SEPARATOR,
    Rows,
    deepened,
    find,
    rows_at,
)

OPEN_TOKENS = 8192  # the open segment's buffer (fewer where the budget is small)
SHIFT = 21  # bits per token in a trigram key (vocabularies up to 2M tokens)


def _trigram_keys(tokens: np.ndarray, ends: np.ndarray) -> np.ndarray:
    t = tokens.astype(np.int64)
    return (t[ends - 2] << (2 * SHIFT)) | (t[ends - 1] << SHIFT) | t[ends]


@dataclass(frozen=True)
class Sealed:
    """A closed segment: its tokens and, per distinct trigram, where it ends."""

    tokens: np.ndarray  # [n] int32, answers separated by SEPARATOR
    keys: np.ndarray  # [u] int64, sorted
    starts: np.ndarray  # [u + 1] int32: key i's ends are ends[starts[i]:starts[i + 1]]
    ends: np.ndarray  # [e] int32, increasing within a key
    answers: int  # answers that ended in it

    @staticmethod
    def of(tokens: np.ndarray, answers: int) -> Sealed:
        t = tokens
        ok = (t[:-2] != SEPARATOR) & (t[1:-1] != SEPARATOR) & (t[2:] != SEPARATOR)
        ends = np.flatnonzero(ok) + 2
        keys = _trigram_keys(t, ends)
        order = np.argsort(keys, kind="stable")
        keys, ends = keys[order], ends[order].astype(np.int32)
        unique, first = np.unique(keys, return_index=True)
        starts = np.append(first, len(keys)).astype(np.int32)
        return Sealed(t.astype(np.int32), unique, starts, ends, answers)

    @property
    def nbytes(self) -> int:
        return self.tokens.nbytes + self.keys.nbytes + self.starts.nbytes + self.ends.nbytes

    def lookup(self, key: int, tail: np.ndarray) -> np.ndarray:
        """End positions of the trigram `key` (`tail`'s last three tokens), increasing,
        deepened."""
        i = int(np.searchsorted(self.keys, key))
        if i == len(self.keys) or self.keys[i] != key:
            return np.zeros(0, dtype=np.int64)
        ends = self.ends[self.starts[i] : self.starts[i + 1]].astype(np.int64)
        return deepened(self.tokens, ends, tail, NGRAM)


class SuffixStore:
    """Earlier answers within `max_bytes` (0: none kept)."""

    def __init__(self, max_bytes: int, open_tokens: int = OPEN_TOKENS) -> None:
        if max_bytes < 0:
            raise ValueError("the store's budget must be >= 0 bytes")
        self.max_bytes = max_bytes
        self.open_tokens = max(64, min(open_tokens, max_bytes // 4 // 8))
        self.sealed: list[Sealed] = []
        self._buffer = np.full(self.open_tokens, SEPARATOR, dtype=np.int32)
        self._size = 0
        self._open_answers = 0
        self.added = 0  # answers ever added
        self.dropped = 0  # answers forgotten with their segments

    @property
    def nbytes(self) -> int:
        """The store's memory: every segment's arrays (the open buffer whole)."""
        if self.max_bytes == 0:
            return 0
        return self._buffer.nbytes + sum(s.nbytes for s in self.sealed)

    @property
    def answers(self) -> int:
        """Answers held (one cut by a segment's end counts where it ended)."""
        return self.added - self.dropped

    def add(self, answer: Sequence[int]) -> None:
        """An answer just given (its tokens), then a separator."""
        if self.max_bytes == 0 or not answer:
            return
        tokens = np.asarray(answer, dtype=np.int32)
        if self._size + len(tokens) + 1 > self.open_tokens:  # split only what cannot fit
            self._seal()
        while len(tokens):
            room = self.open_tokens - 1 - self._size  # one left for the separator
            if room <= 0:
                self._seal()
                continue
            part, tokens = tokens[:room], tokens[room:]
            self._buffer[self._size : self._size + len(part)] = part
            self._size += len(part)
        self._size += 1  # the separator (the buffer is SEPARATOR past its size)
        self._open_answers += 1
        self.added += 1

    def rows(self, tail: np.ndarray, length: int) -> Rows:
        """Rows (see matching.py) from every segment, oldest first, the best `MAX_ROWS`."""
        if self.max_bytes == 0 or len(tail) < NGRAM:
            return Rows.empty(length)
        key = int(_trigram_keys(tail[2::-1], np.array([2]))[0])
        parts = []
        for segment in self.sealed:
            ends = segment.lookup(key, tail)
            if len(ends):
                parts.append(rows_at(segment.tokens, ends, tail, length))
        ends = find(self._buffer, self._size, tail)
        if len(ends) and _agrees(self._buffer, ends[-1], tail, NGRAM):
            parts.append(rows_at(self._buffer, ends, tail, length))
        rows = Rows.join(parts, length)
        if len(rows) > MAX_ROWS:  # the longest matches, the newest among equals
            keep = np.sort(np.argsort(-rows.match, kind="stable")[:MAX_ROWS])
            rows = Rows(rows.match[keep], rows.follow[keep])
        return rows

    def _seal(self) -> None:
        if self._size == 0:
            return
        self.sealed.append(Sealed.of(self._buffer[: self._size].copy(), self._open_answers))
        self._buffer[:] = SEPARATOR
        self._size = self._open_answers = 0
        while len(self.sealed) >= 2:  # the newest grows up to an eighth of the budget
            older, newer = self.sealed[-2], self.sealed[-1]
            if older.nbytes + newer.nbytes > self.max_bytes // 8:
                break
            merged = np.concatenate([older.tokens, newer.tokens])
            self.sealed[-2:] = [Sealed.of(merged, older.answers + newer.answers)]
        while self.sealed and self.nbytes > self.max_bytes:
            self.dropped += self.sealed.pop(0).answers


def _agrees(tokens: np.ndarray, end: int, tail: np.ndarray, depth: int) -> bool:
    """Whether the occurrence ending at `end` agrees with `tail` on `depth` tokens."""
    if end - depth + 1 < 0 or len(tail) < depth:
        return False
    return bool((tokens[end - depth + 1 : end + 1][::-1] == tail[:depth]).all())
