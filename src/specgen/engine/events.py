"""What a decoding loop reports to its caller, one event per step."""

from __future__ import annotations

from dataclasses import dataclass

FINISH_REASONS = ("stop", "length", "context")


@dataclass(frozen=True)
class StepEvent:
    tokens: tuple[int, ...]  # committed this step, already cut at a stop token
    drafted: int = 0  # draft tokens sent to verification (0 for plain AR)
    accepted: int = 0  # of those, how many the target accepted
    finish: str | None = None  # set on the last event: one of FINISH_REASONS
