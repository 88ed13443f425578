"""What drafters hand the scheduler and the verifier: a draft, and the kinds of draft a
drafter can make. Plain data at the bottom of the package, so every layer can use it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Draft:
    """Tokens proposed to follow the anchor, and how they were chosen.

    `probs` is the drafter's proposal distribution q at each position when it samples; None
    means the tokens are a point mass (a greedy or deterministic drafter), which is what
    exact rejection sampling then assumes.
    """

    tokens: torch.Tensor  # [B, k] int64
    probs: torch.Tensor | None = None  # [B, k, V]
    # [B, k] fp32: c_j = P(d_j accepted | d_1..d_{j-1} accepted), the drafter's own estimate
    # from what it knew before drawing d_j (for the verify-length scheduler)
    confidence: torch.Tensor | None = None
    bucket: int = 0  # a class of drafts whose acceptance is tracked apart (e.g. match length)
    source: str | None = None  # which drafter proposed it, where several are mounted
    probe: bool = False  # verified whatever the estimates say (the scheduler's probe)

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def truncated(self, length: int) -> Draft:
        """The first `length` positions of this draft."""
        if length >= self.length:
            return self
        return Draft(
            tokens=self.tokens[:, :length],
            probs=None if self.probs is None else self.probs[:, :length],
            confidence=None if self.confidence is None else self.confidence[:, :length],
            bucket=self.bucket,
            source=self.source,
            probe=self.probe,
        )


_EMPTY: dict[str, Draft] = {}  # by device


def empty_draft(device: torch.device | str = "cpu") -> Draft:
    """No draft (a plain decoding step): one instance per device, shared (a Draft is never
    changed; a new one every plain step was a tenth of a learned drafter's host work
    beside the forward). Made outside inference mode, so any caller may use it."""
    key = str(device)
    known = _EMPTY.get(key)
    if known is None:
        with torch.inference_mode(False):
            tokens = torch.empty(1, 0, dtype=torch.long, device=device)
        known = _EMPTY[key] = Draft(tokens=tokens)
    return known


@dataclass(frozen=True)
class DraftOption:
    """A kind of draft a drafter can make before drafting: the bucket its drafts are tracked
    in, the drafter whose measured draft times price it (`source`, as the cost table names
    it; None: the table's only drafter), and whether its drafts carry confidences that
    decide their verify length (then it drafts as long as it may; otherwise the scheduler
    settles the length before drafting and it drafts only that)."""

    bucket: int = 0
    source: str | None = None
    confidences: bool = False
