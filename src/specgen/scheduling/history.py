"""What the scheduler knows of earlier steps: one recency-weighted history per bucket (a
drafter-chosen class of drafts: the n-gram match length, or one of stacked's drafters),
fed by one `record` per drafted step.

Each step adds, to its bucket:
- per draft position i, a trial when every draft before it was accepted, and a win when
  it was accepted too: the conditional acceptance rates c_i = P(d_i accepted | d_1..d_{i-1}
  accepted), each pulled towards the rate of the position before it while few steps
  are known, the first towards an optimistic prior (`rates`);
- the step as it was verified (verify length, tokens committed): the tokens per second a
  confidence-trimmed drafter really gave (`rate`, priced at its longest draft);
- the step as its drafter drafted it (tokens proposed, verified, committed): what stacked
  compares its drafters by (`own_rate`).

Two clocks. The price of drafting (the first two) fades with every drafted step of any
drafter, roughly the last 30: a drafter not chosen lately drifts back towards the prior
and is tried again. The comparison between drafters fades only with each drafter's own
steps, roughly its last 10, so the idle drafter keeps its estimate until it drafts again.
One clock for both cost stacked up to 1% of modeled speed in the scheduler replays (see
docs/design.md). Estimates only ever use finished steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRIOR_RATE = 0.6  # optimistic enough to try drafting before anything is known
PRIOR_WEIGHT = 2.0
DECAY = 0.97  # the price's clock: per drafted step, whichever drafter drafted it
OWN_DECAY = 0.9  # the comparison's clock: per step of the same drafter
MIN_STEPS = 4.0  # recent steps (faded) before a rate from steps is trusted


def _zeros(n: int) -> list[float]:
    return [0.0] * n


@dataclass
class _Bucket:
    trials: list[float]  # [position]
    wins: list[float]  # [position]
    verified: list[float]  # [verify length]: steps verifying that many
    tokens: float  # committed by those steps
    own_proposed: list[float]  # [tokens proposed]; own clock from here on
    own_verified: list[float]  # [verify length]
    own_tokens: float

    @classmethod
    def empty(cls, positions: int) -> _Bucket:
        n = positions + 1
        return cls(_zeros(positions), _zeros(positions), _zeros(n), 0.0, _zeros(n),
                   _zeros(n), 0.0)  # fmt: skip


def _fade(counts: list[float], decay: float) -> None:
    for i in range(len(counts)):
        counts[i] *= decay


@dataclass
class StepHistory:
    positions: int  # draft positions tracked (the longest draft the costs cover)
    buckets: dict[int, _Bucket] = field(default_factory=dict)

    def record(
        self,
        bucket: int,
        *,
        proposed: int,
        verified: int,
        judged: int,
        accepted: int,
    ) -> None:
        """A finished step of `bucket`: `proposed` tokens drafted, `verified` of them
        verified, `accepted` accepted; the first `judged` positions count as tried (a
        confidence drafter's unverified drafts count as misses)."""
        n = self.positions
        for b in self.buckets.values():  # the price's clock: every drafted step
            for counts in (b.trials, b.wins, b.verified):
                _fade(counts, DECAY)
            b.tokens *= DECAY
        b = self.buckets.setdefault(bucket, _Bucket.empty(n))
        for i in range(min(judged, accepted + 1, n)):
            b.trials[i] += 1.0
            if i < accepted:
                b.wins[i] += 1.0
        b.verified[min(verified, n)] += 1.0
        b.tokens += accepted + 1
        _fade(b.own_proposed, OWN_DECAY)  # the comparison's clock: its own steps
        _fade(b.own_verified, OWN_DECAY)
        b.own_proposed[min(proposed, n)] += 1.0
        b.own_verified[min(verified, n)] += 1.0
        b.own_tokens = b.own_tokens * OWN_DECAY + accepted + 1

    def rates(self, bucket: int, length: int) -> list[float]:
        """c_1..c_length for a draft of this bucket (positions past those tracked: the last).

        Each position is pulled towards the rate of the one before it (the first towards
        `PRIOR_RATE`), so a position with no evidence yet takes its neighbour's. Pulled
        towards the fixed prior instead, a copying drafter whose first three drafts were
        accepted 96% of the time had a fourth priced at 0.6, was never verified past three,
        and so never learnt otherwise (agent-like conversations: 4 tokens a step in 1,126
        of 2,937 steps at 96% acceptance)."""
        b = self.buckets.get(bucket)
        out, prior = [], PRIOR_RATE
        for i in range(length):
            j = min(i, self.positions - 1)
            trials, wins = (0.0, 0.0) if b is None else (b.trials[j], b.wins[j])
            prior = (wins + prior * PRIOR_WEIGHT) / (trials + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def rate(
        self, bucket: int, *, step_seconds: Sequence[float], draft_seconds: float
    ) -> float | None:
        """Tokens per second of this bucket's recent steps as they were verified, each
        drafting its longest draft (`draft_seconds`); None before MIN_STEPS of them."""
        b = self.buckets.get(bucket)
        if b is None or sum(b.verified) < MIN_STEPS:
            return None
        seconds = sum(w * (draft_seconds + step_seconds[n]) for n, w in enumerate(b.verified))
        return b.tokens / seconds

    def own_rate(
        self,
        bucket: int,
        *,
        step_seconds: Sequence[float],
        draft_cost: Callable[[int], float],
    ) -> float | None:
        """Tokens per second of its drafter's last steps of this bucket as they were
        drafted (`draft_cost(k)`: drafting k tokens) and verified; None before MIN_STEPS."""
        b = self.buckets.get(bucket)
        if b is None or sum(b.own_verified) < MIN_STEPS:
            return None
        seconds = sum(w * step_seconds[n] for n, w in enumerate(b.own_verified))
        seconds += sum(w * draft_cost(k) for k, w in enumerate(b.own_proposed) if w)
        return b.own_tokens / seconds
