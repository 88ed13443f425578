"""Choose how many draft tokens to verify: pure functions returning frozen decisions.

A draft comes with conditional acceptance estimates c_1..c_k, c_j = P(d_j accepted | d_1..
d_{j-1} accepted): the drafter's own confidence head (DSpark) or rates learned from earlier
steps. Survival a_j = prod_{i<=j} c_i is the chance that the first j are all accepted, so a
step verifying l drafts commits 1 + sum_{j<=l} a_j tokens in expectation (the bonus always
comes) and costs t_draft + t_verify(1 + l).

`choose_verify_length` (the DSpark paper's Algorithm 1 for one request) admits slots in
order and stops at the first one that does not raise the expected tokens per second.
`threshold_length` verifies while each c_j stays at or above a threshold (DeepSpec's
`--confidence-threshold`).

Why the early stop matters (DSpark paper, Appendix A). c_{j+1} is computed from the drawn
token d_j (the confidence head reads the previous token's Markov embedding), so c_{j+1}
carries information about d_j's value. A rule that decides whether to verify d_j after
looking at c_{j+1} - e.g. a global argmax over every l - verifies d_j more often when its
value makes the later slots look good. Verification then sees a draft distribution skewed
by the value itself, and the output stops following the target: in the paper's two-token
example it becomes (0.85, 0.15) instead of (0.7, 0.3). Both rules here decide about d_j
from c_1..c_j only, all known before d_j was drawn, and once they stop they never look
further; the verify length is then a stopping time of the draft process, under which
rejection sampling stays exact. tests/test_dspark_scheduling.py builds that example and
shows the anticipating rule biased and ours not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class VerifyDecision:
    length: int  # draft tokens to verify (0: a plain decoding step)
    expected_tokens: float  # 1 + sum of survival over the admitted slots
    expected_rate: float  # expected tokens per second (0 when no costs were used)


def survival(conditional: Sequence[float]) -> list[float]:
    """a_j = prod_{i<=j} c_i."""
    out, alive = [], 1.0
    for c in conditional:
        if not 0.0 <= c <= 1.0:
            raise ValueError(f"acceptance estimates must lie in [0, 1]: {list(conditional)}")
        alive *= c
        out.append(alive)
    return out


def choose_verify_length(
    conditional: Sequence[float],
    *,
    step_seconds: Sequence[float],
    draft_seconds: float = 0.0,
) -> VerifyDecision:
    """Args:
    conditional: c_1..c_k in [0, 1].
    step_seconds: step_seconds[n] = target forward over 1 + n tokens, n = 0..k.
    draft_seconds: the drafter's time per step (paid whatever the verify length).
    """
    if len(step_seconds) < len(conditional) + 1:
        raise ValueError(f"need {len(conditional) + 1} step costs, got {len(step_seconds)}")
    if any(t <= 0 for t in step_seconds[: len(conditional) + 1]) or draft_seconds < 0:
        raise ValueError("step costs must be positive")
    best = VerifyDecision(0, 1.0, 1.0 / (draft_seconds + step_seconds[0]))
    expected = 1.0
    for n, a in enumerate(survival(conditional), start=1):
        expected += a
        rate = expected / (draft_seconds + step_seconds[n])
        if rate <= best.expected_rate:
            break  # the paper's rule: stop at the first slot that does not pay
        best = VerifyDecision(n, expected, rate)
    return best


def best_draft(
    conditional: Sequence[float],
    *,
    step_seconds: Sequence[float],
    draft_seconds: float | Sequence[float],
) -> VerifyDecision:
    """The draft length l >= 1 with the best expected tokens per second,
    max_l (1 + a_1 + .. + a_l) / (t_draft(l) + t_verify(1 + l)), t_draft(l) = draft_seconds[l
    - 1] (one number: the same for every l). Decided before drafting, from estimates of
    earlier steps only, so it may take the best l over all of them: nothing it looks at
    depends on the draft. Drafting pays when the rate beats a plain decoding step's
    1 / t_verify(1)."""
    if isinstance(draft_seconds, int | float):
        draft_seconds = (float(draft_seconds),)
    best = VerifyDecision(0, 1.0, 0.0)
    expected = 1.0
    for n, a in enumerate(survival(conditional), start=1):
        expected += a
        paid = draft_seconds[min(n, len(draft_seconds)) - 1]
        rate = expected / (paid + step_seconds[n])
        if rate > best.expected_rate:
            best = VerifyDecision(n, expected, rate)
    return best


def best_verify_length(
    conditional: Sequence[float], *, step_seconds: Sequence[float], draft_seconds: float = 0.0
) -> VerifyDecision:
    """The verify length l = 0..k with the best expected tokens per second, the draft paid
    (`draft_seconds`) whatever l. For estimates that do not depend on the draft's tokens
    (rates learned from earlier steps), where the look-ahead bias `choose_verify_length`
    guards against cannot arise, so this need not stop at the first slot that does not pay:
    on the CPU verifying 3 drafts can cost no more than verifying 2."""
    none = VerifyDecision(0, 1.0, 1.0 / (draft_seconds + step_seconds[0]))
    best = best_draft(conditional, step_seconds=step_seconds, draft_seconds=draft_seconds)
    return best if best.expected_rate > none.expected_rate else none


def threshold_length(conditional: Sequence[float], threshold: float) -> VerifyDecision:
    """Verify d_1..d_l where l is the last slot before the first c_j < threshold
    (threshold 0: every draft token, the `full` policy)."""
    expected, length = 1.0, 0
    for a, c in zip(survival(conditional), conditional, strict=True):
        if c < threshold:
            break
        expected += a
        length += 1
    return VerifyDecision(length, expected, 0.0)
