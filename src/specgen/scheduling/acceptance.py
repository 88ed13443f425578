"""Running estimates of how often drafts are accepted, per position and per kind of draft.

For each bucket (a drafter-chosen class of proposals, e.g. the n-gram match length) and
position i, we track the conditional acceptance rate c_i = P(d_i accepted | d_1..d_{i-1}
accepted) as recency-weighted counts with a prior. Survival is a_j = prod_{i<=j} c_i.
All counts decay a little every step, so a bucket that stopped being drafted drifts back to
the prior and gets explored again. Estimates only ever use finished steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

PRIOR_RATE = 0.6  # optimistic enough to try drafting before anything is known
PRIOR_WEIGHT = 2.0
DECAY = 0.97  # per step: roughly the last 30 steps dominate
MIN_WEIGHT = 4.0  # recent steps before their realised rate (RealisedSteps) is trusted
OWN_DECAY = 0.9  # OwnSteps: per step of the same drafter, its last ~10 steps dominate


@dataclass
class AcceptanceTracker:
    max_positions: int
    trials: dict[int, list[float]] = field(default_factory=dict)
    successes: dict[int, list[float]] = field(default_factory=dict)

    def rates(self, bucket: int, length: int) -> list[float]:
        """c_1..c_length for a draft of this bucket (positions past those tracked: the last)."""
        trials = self.trials.get(bucket, [0.0] * self.max_positions)
        wins = self.successes.get(bucket, [0.0] * self.max_positions)
        out = []
        for i in range(length):
            j = min(i, self.max_positions - 1)
            out.append((wins[j] + PRIOR_RATE * PRIOR_WEIGHT) / (trials[j] + PRIOR_WEIGHT))
        return out

    def decay(self) -> None:
        """One step passes: every count fades a little."""
        _fade(self.trials, self.successes)

    def record(self, bucket: int, verified: int, accepted: int) -> None:
        """A finished step verified `verified` drafts of `bucket`; `accepted` were accepted."""
        self.decay()
        trials = self.trials.setdefault(bucket, [0.0] * self.max_positions)
        wins = self.successes.setdefault(bucket, [0.0] * self.max_positions)
        # position i was a trial if every draft before it was accepted
        for i in range(min(verified, accepted + 1, self.max_positions)):
            trials[i] += 1.0
            if i < accepted:
                wins[i] += 1.0


@dataclass
class RealisedSteps:
    """What a drafter's steps actually verified and committed, per bucket: recency-weighted
    counts per verify length, with the tokens those steps committed.

    For a drafter whose own confidences trim each draft (DSpark), the per-position rates
    above price a draft as if every step verified the same length, but the confidences
    verify long where drafts are good and nothing where they are not, which costs less for
    the same tokens. The rate of the steps as they were verified is the honest estimate of
    what drafting with it gives; priced with the current step costs, so the estimate is
    deterministic (no wall clock) and, like the rates, uses finished steps only."""

    max_length: int
    weight: dict[int, list[float]] = field(default_factory=dict)  # [verify length]
    tokens: dict[int, list[float]] = field(default_factory=dict)  # committed, same index

    def record(self, bucket: int, verified: int, committed: int) -> None:
        """One step of `bucket` (call `fade` first: every drafted step fades the rest)."""
        n = min(verified, self.max_length)
        self.weight.setdefault(bucket, [0.0] * (self.max_length + 1))[n] += 1.0
        self.tokens.setdefault(bucket, [0.0] * (self.max_length + 1))[n] += committed

    def fade(self) -> None:
        """One drafted step passes, whichever drafter drafted it. A drafter not chosen
        lately sees its evidence fade (as its rates fade to their prior), falls below
        MIN_WEIGHT and is priced by its rates again, so a drafter that did badly once is
        tried again later instead of being judged by those steps forever."""
        _fade(self.weight, self.tokens)

    def rate(
        self, bucket: int, *, step_seconds: list[float] | tuple[float, ...], draft_seconds: float
    ) -> float | None:
        """Tokens per second of this bucket's recent steps (None before MIN_WEIGHT of them)."""
        weight = self.weight.get(bucket)
        if weight is None or sum(weight) < MIN_WEIGHT:
            return None
        tokens = sum(self.tokens[bucket])
        seconds = sum(w * (draft_seconds + step_seconds[n]) for n, w in enumerate(weight))
        return tokens / seconds


@dataclass
class OwnSteps:
    """Where several drafters take turns (stacked): each one's recent steps as they were
    drafted and verified, recency-weighted over its own steps only, to compare them by.

    The per-position rates price DFlash optimistically where its first drafts mostly fail
    (its deep positions are seldom tried and stay near the prior), and RealisedSteps fade
    with every drafted step, so the drafter not chosen lately is priced by its rates (or
    prior) again; compared on those terms, stacked stayed on DFlash where DSpark drafted
    better, and under other price lists trailed the better drafter by up to 3%. Here both
    are judged alike, by the tokens per second their own last ~10 steps gave, and the
    estimate of the one not drafting keeps its value until it drafts again: it is retried
    when the drafting one does worse than it did (scheduler.VerifyScheduler.pick). Steps
    are kept as counts per draft and verify length and priced when asked, at the current
    context, as RealisedSteps does."""

    max_length: int
    drafted: dict[int, list[float]] = field(default_factory=dict)  # [draft length]
    verified: dict[int, list[float]] = field(default_factory=dict)  # [verify length]
    tokens: dict[int, float] = field(default_factory=dict)  # committed

    def record(self, bucket: int, drafted: int, verified: int, committed: int) -> None:
        """One step of `bucket`: it fades its own earlier steps, no other drafter's."""
        for counts, n in ((self.drafted, drafted), (self.verified, verified)):
            weights = counts.setdefault(bucket, [0.0] * (self.max_length + 1))
            for i in range(len(weights)):
                weights[i] *= OWN_DECAY
            weights[min(n, self.max_length)] += 1.0
        self.tokens[bucket] = self.tokens.get(bucket, 0.0) * OWN_DECAY + committed

    def rate(
        self,
        bucket: int,
        *,
        step_seconds: Sequence[float],
        draft_seconds: Callable[[int], float],
    ) -> float | None:
        """Tokens per second of this bucket's last steps (None before MIN_WEIGHT of them);
        `draft_seconds(k)`: its time to draft k tokens."""
        verified = self.verified.get(bucket)
        if verified is None or sum(verified) < MIN_WEIGHT:
            return None
        seconds = sum(w * step_seconds[n] for n, w in enumerate(verified))
        seconds += sum(w * draft_seconds(k) for k, w in enumerate(self.drafted[bucket]) if w)
        return self.tokens[bucket] / seconds


def _fade(*groups: dict[int, list[float]]) -> None:
    """One step passes: every count in these per-bucket lists fades a little."""
    for group in groups:
        for counts in group.values():
            for i in range(len(counts)):
                counts[i] *= DECAY
