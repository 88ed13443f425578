"""What a drafter is, and the registry that maps method names to drafter classes.

A drafter proposes a `Draft` for the current anchor (the last committed token) and observes
every token the target commits, with the target's hidden states at the layers it asked
for (`taps`). Its context always mirrors the target's KV cache: `observe` appends what
the cache just committed and `rollback` forgets what the cache forgot, so a drafter never
sees a token the target has not accepted.

Methods are looked up by name in `DRAFTERS`: each is loaded once per pipeline (weights)
and makes a fresh `Drafter` per session (context state). Nothing else in specgen branches
on method names, and no drafter imports another.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import torch

from specgen.errors import CheckpointError

if TYPE_CHECKING:
    from specgen.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


@dataclass(frozen=True)
class Draft:
    """Tokens proposed to follow the anchor, and how they were chosen.

    `probs` is the drafter's proposal distribution q at each position when it samples; None
    means the tokens are a point mass (a greedy or deterministic drafter), which is what
    exact rejection sampling then assumes.
    """

    tokens: torch.Tensor  # [B, k] int64
    probs: torch.Tensor | None = None  # [B, k, V]
    # [B, k] fp32: c_j = P(d_j accepted | d_1..d_{j-1} accepted), the drafter's own estimate
    # from what it knew before drawing d_j (for the verify-length scheduler)
    confidence: torch.Tensor | None = None
    bucket: int = 0  # a class of drafts whose acceptance is tracked apart (e.g. match length)
    source: str | None = None  # which drafter proposed it, where several are mounted
    probe: bool = False  # verified whatever the estimates say (the scheduler's probe)

    @property
    def length(self) -> int:
        return self.tokens.shape[1]

    def truncated(self, length: int) -> Draft:
        """The first `length` positions of this draft."""
        if length >= self.length:
            return self
        return Draft(
            tokens=self.tokens[:, :length],
            probs=None if self.probs is None else self.probs[:, :length],
            confidence=None if self.confidence is None else self.confidence[:, :length],
            bucket=self.bucket,
            source=self.source,
            probe=self.probe,
        )


@dataclass(frozen=True)
class DraftOption:
    """A kind of draft a drafter can make: the bucket its drafts are tracked in, its time per
    step (None: the cost table's, measured for the drafter as a whole) and per draft length,
    and whether its drafts carry confidences that decide their verify length (then it
    drafts as long as it may; otherwise the scheduler settles the length before drafting
    and it drafts only that)."""

    bucket: int = 0
    seconds: float | None = None  # drafting its longest draft
    by_length: tuple[float, ...] = ()  # [k - 1]: drafting k tokens (empty: the table's)
    confidences: bool = False


class Drafter(Protocol):
    taps: tuple[int, ...]  # target layers whose hidden states `observe` needs
    max_draft_tokens: int  # the longest draft `propose` returns

    # Optional: `options: tuple[DraftOption, ...]`, the kinds of draft it can make before
    # drafting (each one bucket). The cost scheduler then judges before drafting whether a
    # draft is expected to pay for its own cost, picks the best option or a plain decoding
    # step (engine/loop.py), and tells a drafter of several options with `select(bucket)`.

    def rollback(self, length: int) -> None:
        """Forget the context from position `length` on (mirrors the target cache)."""

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        """Tokens just committed to the target cache, with their hidden states [B, T, H]."""

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """Up to `max_tokens` tokens to follow `anchor` (fewer, or none, is allowed).

        A drafter that samples draws from `generator` (the request's, so seeded runs repeat;
        None when no sampling is wanted) and returns the distributions it drew from."""


class DraftMethod(Protocol):
    """A registered method: what is loaded once (weights) and makes per-session drafters."""

    architectures: tuple[str, ...]  # config.json architectures of its checkpoints
    needs_drafter: bool  # loads a checkpoint (--drafter or the registry's)
    drafters_needed: int  # checkpoints it mounts: 0, 1, or 2 (stacked)
    max_draft_tokens: int

    # Optional: `registry_drafter(drafters: Mapping[str, str])` picks its checkpoint(s) from
    # a registry entry's drafters (method -> repo); without it, the entry under its own name.

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> DraftMethod:
        """Everything this method needs for `target` (e.g. a drafter checkpoint)."""

    def new_drafter(self, capacity: int) -> Drafter:
        """A drafter with an empty context able to follow `capacity` target tokens."""


DRAFTERS: dict[str, type[DraftMethod]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a `DraftMethod` available as `--method NAME`."""

    def add(cls: type) -> type:
        if name in DRAFTERS or name == "ar":
            raise ValueError(f"method {name!r} is already registered")
        DRAFTERS[name] = cls
        return cls

    return add


def method_of(drafter_dir: Path) -> str:
    """The registered method whose checkpoints have this drafter's architecture."""
    path = drafter_dir / "config.json"
    try:
        architectures = json.loads(path.read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{drafter_dir}: cannot read config.json ({e})") from None
    for name, cls in DRAFTERS.items():
        if set(architectures) & set(cls.architectures):
            return name
    raise CheckpointError(
        f"{drafter_dir}: not a drafter specgen knows (architectures {architectures}); "
        "give --method explicitly"
    )


def empty_draft(device: torch.device | str = "cpu") -> Draft:
    return Draft(tokens=torch.empty(1, 0, dtype=torch.long, device=device))
