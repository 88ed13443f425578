"""Suffix decoding (`--method suffix`): draft what followed the text so far wherever it
occurred before, in this request's prompt and answer or in the process's earlier answers.

SuffixDecoding (Oliaro et al. 2024; vLLM runs Arctic Inference's) keeps a suffix tree over
the request and one over earlier responses; specgen finds the same nodes without a tree
(matching.py: the request's tokens compared all at once, the earlier answers through a
trigram index, store.py) and drafts the most frequent path from the longest match that
scores best. The store is the method's, so every session of a pipeline (a server's
requests, a chat's turns, a bench's prompts) feeds and reads one store, bounded in bytes
(`SpecConfig.store_mib`, oldest answers dropped first).

Drafts are free (no network runs), so the method drafts as long as it may and the cost
scheduler verifies what pays: its acceptance estimates are learnt per bucket, a class of
match length, whether the path branched, and whether it came from the store. A draft is a
point mass fixed by committed tokens, so verification is exact at any temperature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from specgen.core.draft import Draft, empty_draft
from specgen.drafting.base import Checkpoint, Drafter, DraftMethod, register
from specgen.methods.suffix.matching import MAX_MATCH, SEPARATOR, Proposal, find, propose, rows_at
from specgen.methods.suffix.store import SuffixStore

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer

DEFAULT_DRAFT_TOKENS = 32
DEFAULT_STORE_MIB = 64
MATCH_CLASSES = (3, 6, 12, 24)  # match lengths below these are classes 0..3, beyond: 4


def bucket_of(proposal: Proposal, from_store: bool) -> int:
    """The class a draft's acceptance is learnt in: its match length's class, whether its
    first token was the only continuation seen (it branched where not), its source."""
    classes = len(MATCH_CLASSES) + 1
    match_class = sum(proposal.match >= edge for edge in MATCH_CLASSES)
    branched = bool(proposal.probs) and proposal.probs[0] < 1.0
    return match_class + classes * branched + 2 * classes * from_store


@register("suffix")
class SuffixMethod(DraftMethod):
    """Nothing to load; one store of earlier answers for every session of the pipeline."""

    needs_drafter = False
    drafters_needed = 0

    def __init__(self, draft_tokens: int, device: torch.device, store_bytes: int) -> None:
        self.max_draft_tokens = draft_tokens
        self.device = device
        self.store = SuffixStore(store_bytes)
        self.cache_key = f"suffix|{draft_tokens}"

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint] = (),
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> SuffixMethod:
        mib = DEFAULT_STORE_MIB if spec.store_mib is None else spec.store_mib
        return cls(spec.draft_tokens or DEFAULT_DRAFT_TOKENS, target.device, int(mib * 2**20))

    def new_drafter(self, capacity: int) -> SuffixDrafter:
        return SuffixDrafter(self.max_draft_tokens, self.store, device=self.device)


class SuffixDrafter(Drafter):
    taps: tuple[int, ...] = ()
    free = True  # a lookup: its draft may be looked at before it is chosen (stacked)

    def __init__(
        self,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        store: SuffixStore | None = None,
        *,
        factor: float = 1.0,
        min_prob: float = 0.1,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_draft_tokens = draft_tokens
        self.store = store or SuffixStore(0)
        self.factor, self.min_prob = factor, min_prob
        self.device = device
        # the context, then SEPARATOR: room for the anchor at [size] while drafting
        self._tokens = np.full(1024, SEPARATOR, dtype=np.int32)
        self._size = 0

    @property
    def context(self) -> list[int]:
        return self._tokens[: self._size].tolist()

    def rollback(self, length: int) -> None:
        if length < self._size:
            self._tokens[length : self._size] = SEPARATOR
            self._size = length

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        if not len(tokens):
            return
        need = self._size + len(tokens) + 1
        if need > len(self._tokens):
            grown = np.full(max(need, 2 * len(self._tokens)), SEPARATOR, dtype=np.int32)
            grown[: self._size] = self._tokens[: self._size]
            self._tokens = grown
        self._tokens[self._size : self._size + len(tokens)] = tokens
        self._size += len(tokens)

    def answered(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        self.store.add(answer)

    def proposal(self, anchor: int, max_tokens: int, store: bool = True) -> tuple[Proposal, bool]:
        """The best draft of the request's own tokens and of the store (`store`: whether
        to look there; which one drafted: True for the store), before it is a `Draft`."""
        limit = min(max_tokens, self.max_draft_tokens)
        if limit <= 0:
            return Proposal([], [], 0), False
        size = self._size
        tail = np.empty(min(MAX_MATCH, size + 1), dtype=np.int32)  # newest first
        tail[0] = anchor
        tail[1:] = self._tokens[size - len(tail) + 1 : size][::-1]
        self._tokens[size] = anchor  # read as what follows an occurrence ending at size - 1
        try:
            rows = rows_at(self._tokens, find(self._tokens, size, tail), tail, limit)
        finally:
            self._tokens[size] = SEPARATOR
        options = dict(factor=self.factor, min_prob=self.min_prob)
        mine = propose(rows, limit, **options)
        if not store:
            return mine, False
        theirs = propose(self.store.rows(tail, limit), limit, **options)
        if theirs.score > mine.score:
            return theirs, True
        return mine, False

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        # a seeded sampled answer depends on its conversation and seed alone: not on the
        # answers given before it
        seeded = params is not None and params.seeded
        found, from_store = self.proposal(anchor, max_tokens, store=not seeded)
        if not found.tokens:
            return empty_draft(self.device)
        tokens = torch.tensor([found.tokens], dtype=torch.long, device=self.device)
        return Draft(tokens=tokens, bucket=bucket_of(found, from_store))
