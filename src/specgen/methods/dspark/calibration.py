"""Per-position temperature scaling of a drafter's confidences (the DSpark paper's STS).

The confidence head gives a logit z_j per draft slot; calibrated, c_j = sigmoid(z_j / T_j).
What the scheduler needs right is the survival a_j = prod_{i<=j} c_i (the chance that the
first j drafts are all accepted), so the temperatures are fitted left to right: T_1 makes
a_1 calibrated, then T_2 with T_1 fixed makes a_2 calibrated, and so on, each a 1-D grid
search minimising the expected calibration error (ECE, equal-width bins) of a_j against
whether the first j drafts were in fact accepted. Data come from `specgen calibrate`,
which verifies every draft whole so each position is judged whenever it is reached.

The result is stored as `calibration.json` beside the drafter and used when present.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specgen.core.errors import CheckpointError

FILENAME = "calibration.json"
FORMAT = "specgen-confidence-temperatures/1"
GRID = tuple(2.0 ** (i / 8) for i in range(-24, 25))  # 0.125 .. 8, log-spaced
BINS = 15


@dataclass(frozen=True)
class Calibration:
    temperatures: tuple[float, ...]  # per draft position; later positions use the last

    def scale(self, logits: torch.Tensor) -> torch.Tensor:
        """z_j / T_j for the first len(logits) positions."""
        return logits / self._divisors(logits.shape[-1], logits.dtype, logits.device)

    @functools.cache  # noqa: B019 - a few tiny tensors per (frozen) calibration
    def _divisors(self, k: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        # made once, so a CUDA graph capturing `scale` copies nothing from the host
        temps = [self.temperatures[min(j, len(self.temperatures) - 1)] for j in range(k)]
        return torch.tensor(temps, dtype=dtype, device=device)


@dataclass(frozen=True)
class Step:
    """One verified draft: its confidence logits (one per draft token) and how many of its
    leading tokens the target accepted."""

    logits: tuple[float, ...]
    accepted: int


@dataclass(frozen=True)
class CalibrationFit:
    temperatures: tuple[float, ...]
    ece_before: tuple[float, ...]  # per position, survival with T = 1
    ece_after: tuple[float, ...]
    samples: tuple[int, ...]  # steps that drafted each position

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "temperatures": [round(t, 6) for t in self.temperatures],
            "ece_before": [round(e, 6) for e in self.ece_before],
            "ece_after": [round(e, 6) for e in self.ece_after],
            "samples": list(self.samples),
        }


def ece(predicted: Sequence[float], observed: Sequence[bool], bins: int = BINS) -> float:
    """Expected calibration error: per equal-width bin |mean prediction - frequency|,
    weighted by the bin's share of samples."""
    if not predicted:
        return 0.0
    sums = [[0.0, 0.0, 0] for _ in range(bins)]
    for p, o in zip(predicted, observed, strict=True):
        b = sums[min(int(p * bins), bins - 1)]
        b[0] += p
        b[1] += float(o)
        b[2] += 1
    return sum(abs(p - o) for p, o, n in sums if n) / len(predicted)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def fit_temperatures(steps: Sequence[Step], grid: Sequence[float] = GRID) -> CalibrationFit:
    """Fit T_1..T_k left to right (k = the longest draft seen)."""
    depth = max((len(s.logits) for s in steps), default=0)
    if depth == 0:
        raise ValueError("no confidences to calibrate on")
    temps: list[float] = []
    before, after, samples = [], [], []
    # survival of the first j positions per step, with the temperatures fitted so far
    alive_fit = [1.0] * len(steps)
    alive_raw = [1.0] * len(steps)
    for j in range(depth):
        idx = [i for i, s in enumerate(steps) if len(s.logits) > j]
        observed = [steps[i].accepted > j for i in idx]
        raw = [alive_raw[i] * _sigmoid(steps[i].logits[j]) for i in idx]
        best_t, best_e = 1.0, float("inf")
        for t in grid:
            pred = [alive_fit[i] * _sigmoid(steps[i].logits[j] / t) for i in idx]
            e = ece(pred, observed)
            if e < best_e - 1e-12 or (abs(e - best_e) <= 1e-12 and abs(t - 1) < abs(best_t - 1)):
                best_t, best_e = t, e
        for i, r in zip(idx, raw, strict=True):
            alive_raw[i] = r
            alive_fit[i] *= _sigmoid(steps[i].logits[j] / best_t)
        temps.append(best_t)
        before.append(ece(raw, observed))
        after.append(best_e)
        samples.append(len(idx))
    return CalibrationFit(tuple(temps), tuple(before), tuple(after), tuple(samples))


def save_calibration(path: Path, fit: CalibrationFit, extra: dict[str, Any]) -> Path:
    """Write the fit to `path` (a drafter directory gets calibration.json)."""
    if path.is_dir():
        path = path / FILENAME
    record = {**fit.to_dict(), **extra}
    tmp = path.with_suffix(".tmp")
    try:
        tmp.write_text(json.dumps(record, indent=2) + "\n")
        tmp.replace(path)
    except OSError as e:
        raise CheckpointError(f"cannot write the calibration to {path} ({e})") from None
    return path


def load_calibration(drafter_dir: Path) -> Calibration | None:
    """The drafter's fitted temperatures, or None when it has none."""
    path = drafter_dir / FILENAME
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        temps = tuple(float(t) for t in data["temperatures"])
        if data.get("format") != FORMAT or not temps or min(temps) <= 0:
            raise ValueError("unexpected contents")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise CheckpointError(
            f"{path}: not a calibration specgen wrote ({e}); delete it or run "
            "`specgen calibrate` again"
        ) from None
    return Calibration(temps)
