"""What a decoding loop reports to its caller, one event per step (the first is the
prefill's). Words: the drafter *proposes* tokens (`proposal`); the scheduler sends some of
them to verification (`verified`, the verify length); the target *accepts* a leading run
of those and adds its own *bonus* token; the step *commits* the accepted drafts and the
bonus, cut at a stop token or the token limit (`tokens`)."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_REASONS = ("stop", "length", "context")


@dataclass(frozen=True)
class TokenLogprob:
    """A token's log-probability under the target's raw distribution (log_softmax of its
    logits at that position), and the likeliest tokens' there, likeliest first."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token, logprob) pairs


@dataclass(frozen=True)
class StepEvent:
    tokens: tuple[int, ...]  # committed this step, already cut at a stop token
    verified: int = 0  # draft tokens sent to verification (the verify length; 0 for AR)
    accepted: int = 0  # of those, how many the target accepted
    finish: str | None = None  # set on the last event: one of FINISH_REASONS
    proposal: tuple[int, ...] = ()  # what the drafter proposed, before any trimming
    bonus: int | None = None  # the target's own token this step
    confidence: tuple[float, ...] = ()  # the drafter's c_j for each proposed token, if any
    drafter: str | None = None  # which drafter proposed (stacked mounts several)
    # when the sampling params ask for logprobs: one per committed token, and one more
    # for the stop token that ended the answer, if one did (else empty)
    logprobs: tuple[TokenLogprob, ...] = ()
