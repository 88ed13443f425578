"""Running estimates of how often drafts are accepted, per position and per kind of draft.

For each bucket (a drafter-chosen class of proposals, e.g. the n-gram match length) and
position i, we track the conditional acceptance rate c_i = P(d_i accepted | d_1..d_{i-1}
accepted) as recency-weighted counts with a prior. Survival is a_j = prod_{i<=j} c_i.
All counts decay a little every step, so a bucket that stopped being drafted drifts back to
the prior and gets explored again. Estimates only ever use finished steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PRIOR_RATE = 0.6  # optimistic enough to try drafting before anything is known
PRIOR_WEIGHT = 2.0
DECAY = 0.97  # per step: roughly the last 30 steps dominate


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
        for counts in (*self.trials.values(), *self.successes.values()):
            for i in range(len(counts)):
                counts[i] *= DECAY

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
