"""Offline acceptance: the τ greedy decoding would reach on held-out answers, without decoding.

Along a held-out answer of the target (its own greedy tokens), a decoding step anchored at
committed position p accepts the longest prefix of the drafter's block that matches the
next tokens, then commits the target's bonus token, so the next anchor is p + accepted + 1.
Each method computes the accepted drafts at every anchor in batched passes
(`DrafterTraining.evaluate`; block drafters in `block_drafters.py`, the same blocks as
inference) and the walk below is replayed on them. Heads that draw left to right (DSpark's
Markov head) are teacher-forced, which gives the same accepted prefix: a slot is only
reached when every earlier draft equalled the true token. τ counts the bonus token,
as the engine does. The CPU study found this within 0.03 of real decoding.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OfflineAcceptance:
    tau: float  # committed tokens per verify step, bonus included
    steps: int
    per_position: list[float]  # share of steps whose k-th draft was accepted


def walk(answers: Iterable[tuple[int, torch.Tensor]]) -> OfflineAcceptance:
    """Greedy decoding's steps along each answer, from (first anchor, accepted drafts at
    each anchor): any drafter's, once its drafts at every anchor are known."""
    steps, committed = 0, 0
    reached: list[int] = []
    for lo, accepted in answers:
        p = lo
        while p - lo < accepted.shape[0]:
            a = int(accepted[p - lo])
            steps, committed = steps + 1, committed + a + 1
            reached.extend(range(a))
            p += a + 1
    slots = max(reached, default=-1) + 1
    per_position = [sum(1 for r in reached if r == k) / max(steps, 1) for k in range(slots)]
    return OfflineAcceptance(committed / max(steps, 1), steps, per_position)
