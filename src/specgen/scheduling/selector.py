"""Which drafter drafts the next step (the stacked pipeline): a pure, non-anticipating choice.

Each mounted drafter has a recency-weighted record of the steps it drafted: tokens each
step committed (accepted + 1) and how many it proposed. Its expected rate is

    expected tokens per step / (its draft time + the target's time to verify that many)

with the expectation pulled towards a prior while it has few steps, and the costs from the
measured cost table. The fastest expected drafter is chosen; a drafter not chosen for
`explore_every` steps is tried once, so a drafter that fell behind on one kind of text
gets a chance when the text changes. Only finished steps enter a record, so the choice
never depends on the tokens it will be judged on: the output stays exact whichever
drafter drafts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

DECAY = 0.9  # per step of the same drafter: the last ~10 of its steps dominate
PRIOR_TOKENS = 2.0  # optimistic: every drafter deserves a few steps
PRIOR_WEIGHT = 1.0
EXPLORE_EVERY = 16


@dataclass(frozen=True)
class DrafterRecord:
    steps: float = 0.0  # decayed count of steps it drafted
    tokens: float = 0.0  # decayed sum of tokens those steps committed
    proposed: float = 0.0  # decayed sum of draft lengths
    last_step: int = -(10**9)  # the step it last drafted

    def expected_tokens(self) -> float:
        return (self.tokens + PRIOR_TOKENS * PRIOR_WEIGHT) / (self.steps + PRIOR_WEIGHT)

    def mean_proposed(self) -> float:
        return self.proposed / self.steps if self.steps else 0.0


def record_step(
    records: Sequence[DrafterRecord], chosen: int, step: int, committed: int, proposed: int
) -> tuple[DrafterRecord, ...]:
    """The records after drafter `chosen`'s step `step` committed `committed` tokens."""
    r = records[chosen]
    new = replace(
        r,
        steps=r.steps * DECAY + 1.0,
        tokens=r.tokens * DECAY + committed,
        proposed=r.proposed * DECAY + proposed,
        last_step=step,
    )
    return tuple(new if i == chosen else old for i, old in enumerate(records))


def choose_drafter(
    records: Sequence[DrafterRecord],
    *,
    step: int,
    draft_seconds: Sequence[float],
    step_seconds: Sequence[float],
    explore_every: int = EXPLORE_EVERY,
) -> int:
    """The index of the drafter for step `step` (ties: the lower index)."""
    for i, r in enumerate(records):  # one not tried lately goes first
        if step - r.last_step > explore_every:
            return i
    rates = []
    for r, t_draft in zip(records, draft_seconds, strict=True):
        verify = step_seconds[min(round(r.mean_proposed()), len(step_seconds) - 1)]
        rates.append(r.expected_tokens() / (t_draft + verify))
    return max(range(len(rates)), key=lambda i: (rates[i], -i))
