"""Drafters whose drafts a test decides: an oracle that drafts the answer it is given
(every draft accepted), and a resident one that drafts from an answer key."""

from __future__ import annotations

import torch

from specgen.core.draft import Draft, empty_draft
from specgen.drafting.base import Drafter, ResidentDrafter


class OracleDrafter(Drafter):
    """Proposes exactly what the target would say greedily (drafter = target)."""

    taps: tuple[int, ...] = ()

    def __init__(self, model, draft_tokens=4):
        self.model, self.max_draft_tokens, self.context = model, draft_tokens, []

    def rollback(self, length):
        self.context = self.context[:length]

    def observe(self, tokens, taps):
        self.context += list(tokens)

    def propose(self, anchor, max_tokens, params=None, generator=None):
        seq = self.context + [anchor]
        out = []
        for _ in range(min(max_tokens, self.max_draft_tokens)):
            logits = self.model(torch.tensor([seq]), self.model.new_cache(len(seq))).logits
            seq.append(int(logits[0, -1].argmax()))
            out.append(seq[-1])
        return Draft(torch.tensor([out])) if out else empty_draft()


class AnswerKeyDrafter(ResidentDrafter):
    """Drafts from a known token sequence (prompt + the target's greedy answer), with
    every `wrong`-th draft changed; serves both loops. Its only state is the context
    length, which the resident loop gives it on the device (read here: a test drafter)."""

    taps: tuple[int, ...] = ()

    def __init__(self, sequence: list[int], draft_tokens: int = 4, wrong: int = 0) -> None:
        self.sequence, self.max_draft_tokens, self.wrong = sequence, draft_tokens, wrong
        self.length = 0
        self.assumed: list[int] = []
        self.drafted_at: list[tuple[int, int]] = []

    def _draft(self, start: int, k: int) -> Draft:
        tokens = [self._at(start + 1 + i) for i in range(k)]
        for i in range(self.wrong - 1, k, self.wrong or k + 1):
            tokens[i] = (tokens[i] + 1) % 256
        return Draft(torch.tensor([tokens]))

    def _at(self, position: int) -> int:
        return self.sequence[position] if position < len(self.sequence) else 0

    def rollback(self, length):
        self.length = min(self.length, length)

    def observe(self, tokens, taps):
        self.length += len(tokens)

    def propose(self, anchor, max_tokens, params=None, generator=None):
        return self._draft(self.length, min(max_tokens, self.max_draft_tokens))

    def begin_resident(self):
        pass

    def draft_at(self, anchor, start, k, params=None, generator=None):
        self.drafted_at.append((int(start), self.length))  # where, and what the host knew
        return self._draft(int(start), k)

    def observe_at(self, tokens, taps, start):
        pass

    def assume(self, length):
        self.length = length
        self.assumed.append(length)
