"""Choose the verify length that maximises expected tokens per second.

Given survival estimates a_j = P(the first j draft tokens are all accepted) and the time a
step takes when it verifies n draft tokens, a step that verifies l tokens is expected to
commit 1 + sum_{j<=l} a_j tokens (the bonus always comes). Slots are admitted in order and
admission stops at the first slot that does not raise expected tokens per second (the
DSpark paper's rule).

Losslessness: the decision may only use what was known before the drafts were verified -
estimates from earlier steps and the drafter's own signals - never the target's verdict on
these tokens. Shortening a draft on such information only changes how much work a step
does, not which tokens come out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyDecision:
    length: int  # draft tokens to verify (0: a plain decoding step)
    expected_tokens: float  # 1 + sum of survival over the admitted slots
    expected_rate: float  # expected tokens per second


def choose_verify_length(
    survival: Sequence[float], *, step_seconds: Sequence[float]
) -> VerifyDecision:
    """Args:
    survival: a_1..a_k, non-increasing probabilities in [0, 1].
    step_seconds: step_seconds[n] = time of a step verifying n drafts, n = 0..k.
    """
    if len(step_seconds) < len(survival) + 1:
        raise ValueError(f"need {len(survival) + 1} step costs, got {len(step_seconds)}")
    if any(not 0.0 <= a <= 1.0 for a in survival):
        raise ValueError(f"survival estimates must lie in [0, 1]: {list(survival)}")
    if any(t <= 0 for t in step_seconds[: len(survival) + 1]):
        raise ValueError("step costs must be positive")
    best = VerifyDecision(0, 1.0, 1.0 / step_seconds[0])
    expected = 1.0
    for n, a in enumerate(survival, start=1):
        expected += a
        rate = expected / step_seconds[n]
        if rate <= best.expected_rate:
            break
        best = VerifyDecision(n, expected, rate)
    return best
