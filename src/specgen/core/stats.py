"""Per-request statistics. Step events in, a dict out; no model code.

τ (acceptance length) counts the bonus token: it is accepted draft tokens + 1 per step,
averaged over steps (Spec-Bench / vLLM / DFlash convention), so plain AR has τ = 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specgen.core import clock
from specgen.core.config import AR
from specgen.core.events import StepEvent


@dataclass
class GenStats:
    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually run (the rest came from the cache)
    new_tokens: int = 0
    steps: int = 0
    verified: int = 0  # draft tokens sent to verification
    accepted: int = 0
    verified_per_position: list[int] = field(default_factory=list)  # steps verifying >= k+1
    accepted_per_position: list[int] = field(default_factory=list)  # steps accepting >= k+1
    seconds: float = 0.0  # from the start of the prefill to the last token
    ttft_seconds: float | None = None  # time to first token (prefill + first sample)
    confidence_sum: float = 0.0  # over every drafted token that had a confidence
    confidence_count: int = 0
    verify_policy: str | None = None  # how verify lengths were chosen (None for AR)
    by_drafter: dict[str, list[int]] = field(default_factory=dict)  # name -> [steps, accepted]
    finish_reason: str | None = None
    trace: list[dict[str, Any]] | None = None  # one record per step when tracing is on
    method: str = AR  # the drafter's name in traces and shapes when a step names none
    # each decoding step after the prefill: (tokens of context before it, the drafter that
    # drafted it or None, tokens proposed, its verify length, tokens it committed), which
    # bench/modeled.py prices
    shapes: list[tuple[int, str | None, int, int, int]] = field(default_factory=list, repr=False)
    step_seconds: list[float] = field(default_factory=list, repr=False)  # each shape's, as run
    _start: float = field(default_factory=lambda: clock.now(), repr=False)

    def record(self, event: StepEvent) -> None:
        """One step of the answer (the first is the prefill's)."""
        context = self.prompt_tokens + self.new_tokens - 1  # the cache, the anchor not in it
        before = self.seconds
        self.record_step(
            len(event.tokens),
            event.verified,
            event.accepted,
            event.finish,
            event.confidence,
            event.drafter,
        )
        if self.steps > 1:  # a decoding step
            drafter = (event.drafter or self.method) if event.proposal else None
            shape = (context, drafter, len(event.proposal), event.verified, len(event.tokens))
            self.shapes.append(shape)
            self.step_seconds.append(self.seconds - before)
        if self.trace is not None:
            self.trace.append(trace_record(event, self.method))

    def record_step(
        self,
        tokens: int,
        verified: int,
        accepted: int,
        finish: str | None,
        confidence: tuple[float, ...] = (),
        drafter: str | None = None,
    ) -> None:
        now = clock.now() - self._start
        if self.ttft_seconds is None:
            self.ttft_seconds = now
        self.seconds = now
        self.new_tokens += tokens
        self.steps += 1
        self.verified += verified
        self.accepted += accepted
        if drafter is not None:  # only where several drafters take turns (stacked)
            counts = self.by_drafter.setdefault(drafter, [0, 0])
            counts[0] += 1
            counts[1] += accepted
        self.confidence_sum += sum(confidence)
        self.confidence_count += len(confidence)
        _count_positions(self.verified_per_position, verified)
        _count_positions(self.accepted_per_position, accepted)
        if finish is not None:
            self.finish_reason = finish

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def acceptance_length(self) -> float:
        """τ: accepted draft tokens + 1 (the bonus) per step, averaged over steps."""
        return (self.accepted + self.steps) / self.steps if self.steps else 0.0

    @property
    def mean_verify_length(self) -> float:
        """Draft tokens verified per target forward (the prefill's forward counts, as in τ)."""
        return self.verified / self.steps if self.steps else 0.0

    @property
    def mean_confidence(self) -> float | None:
        """The drafter's mean c_j over the tokens it proposed (None: no confidence head)."""
        return self.confidence_sum / self.confidence_count if self.confidence_count else None

    def acceptance_per_position(self) -> list[float]:
        """For each draft position k, up to the longest draft ever verified: of the steps
        that verified a k-th draft token, the fraction whose k-th token was accepted (zeros
        kept; empty for AR). The one definition: JSON stats, the live view and bench."""
        accepted = self.accepted_per_position
        return [
            round((accepted[k] if k < len(accepted) else 0) / d, 4)
            for k, d in enumerate(self.verified_per_position)
        ]

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens": self.prefill_tokens,
            "new_tokens": self.new_tokens,
            "seconds": round(self.seconds, 4),
            "ttft_seconds": None if self.ttft_seconds is None else round(self.ttft_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "steps": self.steps,
            "acceptance_length": round(self.acceptance_length, 3),
            "drafted_tokens": self.verified,  # vLLM's num_draft_tokens: sent to verification
            "accepted_tokens": self.accepted,
            "mean_verify_length": round(self.mean_verify_length, 3),
            "mean_confidence": _round(self.mean_confidence, 4),
            "verify_policy": self.verify_policy,
            # stacked: steps each drafter drafted and its τ over them (incl. bonus)
            "drafters": {
                name: {"steps": n, "tau": round((a + n) / n, 3)}
                for name, (n, a) in self.by_drafter.items()
            },
            # per draft position: accepted / verified there (acceptance_per_position)
            "accepted_per_position": self.acceptance_per_position(),
            "finish_reason": self.finish_reason,
        }


def _count_positions(counts: list[int], n: int) -> None:
    """counts[k] += 1 for k < n, growing the list as needed."""
    counts.extend([0] * (n - len(counts)))
    for k in range(n):
        counts[k] += 1


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def trace_record(event: StepEvent, method: str) -> dict[str, Any]:
    """What `--trace` shows for one step (the first step of an answer is the prefill)."""
    record = {
        "drafter": event.drafter or method,
        "draft": list(event.proposal),
        "verify_length": event.verified,
        "accepted": event.accepted,
        "bonus": event.bonus,
        "committed": list(event.tokens),
    }
    if event.confidence:  # the drafter's c_j for each proposed token
        record["confidence"] = [round(c, 6) for c in event.confidence]
    return record
