"""A constraint on what an answer may say (a JSON Schema, a tool call's shape), applied to
the target's rows exactly where plain decoding would apply it.

`Constraint.allowed(drafts)` gives one row of allowed tokens per position a step scores:
row j is what may follow the answer so far plus `drafts[:j]`. Masking a verify pass's
row j with it is what constrained plain decoding does after d1..dj, so a draft token the
constraint forbids has probability 0 in its row and is rejected as the target would reject
it (greedy: it is never the argmax; sampling: it is never accepted, and the residual
carries its mass, so the answer keeps the constrained target's distribution). Rows after
a forbidden draft decide nothing and are left unmasked. Drafts themselves are not masked
before verification: trimming a draft at a forbidden token would change which residual a
sampled bonus comes from, and so the distribution.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch


class Constraint(ABC):
    """One answer's constraint state; the decoding loop commits what it keeps."""

    @abstractmethod
    def allowed(self, drafts: Sequence[int] = ()) -> torch.Tensor:
        """[len(drafts) + 1, V] bool: the tokens allowed after the answer so far and each
        prefix of `drafts` (rows after the first forbidden draft: all True)."""

    @abstractmethod
    def commit(self, tokens: Sequence[int]) -> None:
        """The answer goes on with `tokens` (each allowed where it stands)."""


def masked(
    constraint: Constraint | None, logits: torch.Tensor, drafts: Sequence[int] = ()
) -> torch.Tensor:
    """`logits` ([1, V] for one position, [1, k+1, V] for a verify pass over k drafts)
    with every token the constraint forbids at its row set to -inf."""
    if constraint is None:
        return logits
    allowed = constraint.allowed(drafts).to(logits.device)
    vocab = logits.shape[-1]
    if allowed.shape[-1] < vocab:  # the model's head may be padded past the tokenizer
        pad = torch.zeros(allowed.shape[0], vocab - allowed.shape[-1], dtype=torch.bool)
        allowed = torch.cat([allowed, pad.to(allowed.device)], dim=-1)
    allowed = allowed[:, :vocab].view(*logits.shape[:-1], vocab)
    return logits.masked_fill(~allowed, float("-inf"))
