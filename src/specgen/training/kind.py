"""What training a drafter of one method takes: the hooks the training loop calls.

A trainable method's package (`specgen.methods.NAME.training`) supplies one and attaches
it to its registered method class (`DraftMethod.training`); the loop (`training/loop.py`)
finds it by the method's name and never asks which network it trains.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from specgen.core.errors import SpecgenError
from specgen.drafting.base import DRAFTERS

if TYPE_CHECKING:
    from specgen.models.transformer import Transformer
    from specgen.training.evaluate import OfflineAcceptance
    from specgen.training.loop import TrainConfig
    from specgen.training.trainer import Prepared, Vocab


class DrafterTraining(ABC):
    """One method's training: its config, starting weights, loss, held-out τ and writer."""

    # whether `--init target|DIR` (the target's upper layers, a trained drafter) can start it
    warm_starts: bool = False

    @abstractmethod
    def config(
        self, target_config: dict[str, Any], target_layers: int, cfg: TrainConfig,
        vocab: Vocab | None,
    ) -> dict[str, Any]:  # fmt: skip
        """The new drafter's config.json, in the layout this method is published in."""

    @abstractmethod
    def new(
        self, target: Transformer, config: dict[str, Any], cfg: TrainConfig, vocab: Vocab | None
    ) -> torch.nn.Module:
        """The starting weights (random, or from the target where `cfg` asks)."""

    def trainable(self, net: torch.nn.Module) -> list[torch.nn.Parameter]:
        """The parameters the optimiser moves (all of the drafter's own, by default)."""
        params = list(net.parameters())
        for p in params:
            p.requires_grad_(True)
        return params

    @abstractmethod
    def reads(
        self, net: torch.nn.Module, target: Transformer
    ) -> tuple[tuple[int, ...], int | None]:
        """(the target layers the drafter taps, the last layer too when its loss reads the
        target's own distribution, else None): what the features cache must hold."""

    @abstractmethod
    def loss(
        self, target: Transformer, net: torch.nn.Module, item: Prepared, *,
        anchors_per_sequence: int, gamma: float, generator: torch.Generator,
        vocab: Vocab | None,
    ) -> tuple[torch.Tensor, dict[str, float]] | None:  # fmt: skip
        """The loss of one sequence's random anchors (None when it has none)."""

    @abstractmethod
    def evaluate(
        self, target: Transformer, net: torch.nn.Module, held: list[Prepared], vocab: Vocab | None
    ) -> OfflineAcceptance:
        """Held-out τ, greedy, without decoding (`training/evaluate.py`)."""

    @abstractmethod
    def write(
        self, out: Path, net: torch.nn.Module, config: dict[str, Any], vocab: Vocab | None,
        record: dict[str, Any],
    ) -> None:  # fmt: skip
        """The drafter in its public format, with `record` under `specgen_training`."""

    def load(self, path: Path, target: Transformer) -> torch.nn.Module:
        """A trained drafter of this method, to start from (`--init DIR`)."""
        raise SpecgenError(f"{path}: this kind of drafter starts from random weights only")


def training_of(name: str) -> DrafterTraining:
    """The training hooks of the registered method `name` (`specgen.methods` registers
    them when imported); a clear error for a method that cannot be trained."""
    if not DRAFTERS:  # a caller that skipped the import that registers them: a bug
        raise RuntimeError("no drafter method is registered: import specgen.methods first")
    cls = DRAFTERS.get(name)
    hooks = None if cls is None else cls.training
    if hooks is None:
        trainable = [n for n, c in DRAFTERS.items() if c.training is not None]
        listed = ", ".join(trainable[:-1]) + " or " + trainable[-1] if trainable else "none"
        raise SpecgenError(f"--kind must be {listed} (got {name!r})")
    return hooks
