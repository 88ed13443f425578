"""Prompt lookup (`--method ngram`): propose what followed the last time the context read
the same way.

The last n tokens (n = 3, then 2, then 1) are looked up among earlier positions of prompt +
output; the tokens that followed the most recent earlier match are proposed. Training-free
and strong wherever the answer copies its input (summaries, RAG, code edits). The draft is
a point mass, so verification stays exact at any temperature.

Lookups are O(1): for each n, a dict maps an n-gram to the latest position where it ended,
kept one position behind the context so it never finds the current suffix itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft, empty_draft
from specgen.drafting.base import Checkpoint, Drafter, DraftMethod, register

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer

DEFAULT_DRAFT_TOKENS = 10


@register("ngram")
class NgramMethod(DraftMethod):
    """Nothing to load: each session gets a fresh lookup index."""

    needs_drafter = False
    drafters_needed = 0

    def __init__(self, draft_tokens: int, device: torch.device) -> None:
        self.max_draft_tokens = draft_tokens
        self.device = device
        self.cache_key = f"ngram|{draft_tokens}"

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint] = (),
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> NgramMethod:
        return cls(spec.draft_tokens or DEFAULT_DRAFT_TOKENS, target.device)

    def new_drafter(self, capacity: int) -> NgramDrafter:
        return NgramDrafter(self.max_draft_tokens, device=self.device)


class NgramDrafter(Drafter):
    taps: tuple[int, ...] = ()
    free = True  # a lookup: its draft may be looked at before it is chosen (stacked)

    def __init__(
        self,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        max_n: int = 3,
        device: torch.device | str = "cpu",
    ) -> None:
        self.max_draft_tokens = draft_tokens
        self.max_n = max_n
        self.device = device
        self.context: list[int] = []
        self._ends: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n + 1)]

    def rollback(self, length: int) -> None:
        if length < len(self.context):
            self.context = self.context[:length]
            self._ends = [{} for _ in range(self.max_n + 1)]
            for end in range(len(self.context) - 1):
                self._index(end)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        for token in tokens:
            self.context.append(int(token))
            if len(self.context) >= 2:
                self._index(len(self.context) - 2)

    def _index(self, end: int) -> None:
        """Record the n-grams that end at `end` (always one behind the context's end)."""
        for n in range(1, self.max_n + 1):
            if end - n + 1 >= 0:
                self._ends[n][tuple(self.context[end - n + 1 : end + 1])] = end

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        sequence = self.context + [anchor]
        last = len(self.context) - 1  # the newest end an earlier match can have
        limit = min(max_tokens, self.max_draft_tokens)
        for n in range(min(self.max_n, len(self.context)), 0, -1):
            pattern = tuple(sequence[-n:])
            if tuple(sequence[-n - 1 : -1]) == pattern:
                end = last  # not indexed yet: the index stays one position behind
            else:
                end = self._ends[n].get(pattern)
            if end is not None and limit > 0:
                follow = sequence[end + 1 : end + 1 + limit]
                tokens = torch.tensor([follow], dtype=torch.long, device=self.device)
                return Draft(tokens=tokens, bucket=n)  # longer matches are accepted more
        return empty_draft(self.device)
