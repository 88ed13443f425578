"""`--verify-policy`: how the verify length of each step is chosen.

- `cost` (default): the length with the best expected tokens per second, from the
  drafter's confidences (or acceptance learned from earlier steps) and measured costs.
- `full`: verify every draft token.
- `threshold=X`: verify while each slot's acceptance estimate c_j >= X (DeepSpec's rule).
"""

from __future__ import annotations

from dataclasses import dataclass

from specgen.errors import SpecgenError

KINDS = ("cost", "full", "threshold")


@dataclass(frozen=True)
class VerifyPolicy:
    kind: str = "cost"
    threshold: float = 0.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecgenError(f"--verify-policy must be cost, full or threshold=X (got {self})")
        if not 0.0 <= self.threshold <= 1.0:
            raise SpecgenError(f"--verify-policy threshold must be in [0, 1] (got {self})")

    @classmethod
    def parse(cls, text: str) -> VerifyPolicy:
        name, sep, value = text.strip().partition("=")
        if name == "threshold" and sep:
            try:
                return cls("threshold", float(value))
            except ValueError:
                pass
        elif not sep and name in ("cost", "full"):
            return cls(name)
        raise SpecgenError(f"--verify-policy must be cost, full or threshold=X (got {text!r})")

    @property
    def needs_costs(self) -> bool:
        return self.kind == "cost"

    def __str__(self) -> str:
        return f"threshold={self.threshold:g}" if self.kind == "threshold" else self.kind
