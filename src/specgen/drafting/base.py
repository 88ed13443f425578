"""What a drafter is (the protocols every method implements), and the registry that maps
method names to their classes.

A drafter proposes a `Draft` for the current anchor (the last committed token) and observes
every token the target commits, with the target's hidden states at the layers it asked
for (`taps`). Its context always mirrors the target's KV cache: `observe` appends what
the cache just committed and `rollback` forgets what the cache forgot, so a drafter never
sees a token the target has not accepted.

Methods are looked up by name in `DRAFTERS`: each is loaded once per pipeline (weights)
and makes a fresh `Drafter` per session (context state). Nothing else in specgen branches
on method names, and no drafter imports another (stacked composes them through these
protocols).
"""

from __future__ import annotations

import json
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from specgen.core.config import AR
from specgen.core.draft import Draft, DraftOption
from specgen.core.errors import CheckpointError

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


@dataclass(frozen=True)
class Checkpoint:
    """A drafter checkpoint on disk (resolved by the pipeline), and its name in messages."""

    path: Path
    name: str

    @property
    def short_name(self) -> str:
        """Its name in status lines: a local checkpoint's directory name (its full path is
        long and says little there), a Hub repo or a packaged drafter as given."""
        local = Path(self.name).expanduser()
        return local.name if local.name and local.exists() else self.name


class Drafter(Protocol):
    """One session's drafter. Subclass it explicitly to inherit the defaults below."""

    taps: tuple[int, ...]  # target layers whose hidden states `observe` needs
    max_draft_tokens: int  # the longest draft `propose` returns
    # The kinds of draft it can make, known before drafting (one bucket each): the cost
    # scheduler then judges whether a draft pays, picks the best option or a plain decoding
    # step, and names its pick with `select`. Empty: it drafts every step, unjudged.
    options: tuple[DraftOption, ...] = ()
    resident: bool = False  # it is a `ResidentDrafter` (engine/resident.py can drive it)
    # Its drafts cost nothing and draw nothing (a copy drafter): `propose` may be called to
    # look at the draft before choosing whether to use it (stacked offers it so, per step).
    free: bool = False

    @abstractmethod
    def rollback(self, length: int) -> None:
        """Forget the context from position `length` on (mirrors the target cache)."""

    @abstractmethod
    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        """Tokens just committed to the target cache, with their hidden states [B, T, H]."""

    @abstractmethod
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
        ...

    def options_at(self, anchor: int, params: SamplingParams) -> tuple[DraftOption, ...]:
        """The options for a draft after `anchor` (on the host) in an answer sampled with
        `params`: `options`, unless what it can draft there is known for free before
        drafting (stacked over a copy drafter)."""
        return self.options

    def select(self, bucket: int) -> None:
        """The scheduler's pick among `options` for the next draft."""

    def answered(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        """An answer ended (or was cut short): its prompt and the tokens it gave. A drafter
        that learns from a process's earlier answers (suffix) keeps them here."""

    def tensors(self) -> list[torch.Tensor]:
        """Its weights and state (context caches), for the bench's memory figures."""
        return []


class ResidentDrafter(Drafter, Protocol):
    """A drafter whose draft step has fixed shapes, driven by the device-resident loop with
    the anchor and the context length in device memory (engine/resident.py)."""

    resident: bool = True

    @abstractmethod
    def begin_resident(self) -> None:
        """Before the first `draft_at` of an answer: settle what the context holds."""

    @abstractmethod
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the context length
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        """`propose` from device-resident state (the host never reads `anchor`, `start`)."""
        ...

    @abstractmethod
    def observe_at(
        self,
        tokens: torch.Tensor,  # [1, T] int64 on the device: the verified block [anchor, drafts]
        taps: Mapping[int, torch.Tensor],  # [1, T, H] each: the block's hidden states
        start: torch.Tensor,  # [1] int64 on the device: the block's first position
    ) -> None:
        """Every verified position's tokens and features, written from `start` (some are
        rejected: `assume` later says how many count). A drafter that pairs features with
        the next token (EAGLE-3) needs the tokens; block drafters read only the features."""

    @abstractmethod
    def assume(self, length: int) -> None:
        """The first `length` context positions, written by `observe_at`, are committed."""


class DraftMethod(Protocol):
    """A registered method: what is loaded once (weights) and makes per-session drafters.
    Subclass it explicitly to inherit the defaults below."""

    name: ClassVar[str]  # set by `register`
    architectures: ClassVar[tuple[str, ...]] = ()  # config.json architectures it loads
    needs_drafter: ClassVar[bool] = True  # loads a checkpoint (--drafter or the registry's)
    # checkpoints it mounts: 0, 1, or (stacked) at least this many (`mounts`)
    drafters_needed: ClassVar[int] = 1
    # methods whose checkpoints `--method NAME` also runs, under their own name
    variants: ClassVar[tuple[str, ...]] = ()
    # how `specgen train --kind NAME` trains one (a training.kind.DrafterTraining; None:
    # not trainable) and how `specgen export` serves one elsewhere (an
    # export_hints.ExportHints; None: no other engine runs it); held here, typed loosely,
    # so that the registry stays below the training kit and the exporter
    training: ClassVar[Any] = None
    export: ClassVar[Any] = None
    max_draft_tokens: int
    cache_key: str  # the drafter and its settings, for cached draft costs

    @classmethod
    def claims(cls, config: dict) -> bool:
        """Whether a drafter checkpoint with this config.json is this method's."""
        return bool(set(config.get("architectures") or []) & set(cls.architectures))

    @classmethod
    def locate(cls, source: str) -> Path | None:
        """Where a --drafter value that this method reads its own way is on disk (a
        directory with config.json), e.g. a whole model named by alias or GGUF file for a
        draft model; None: not such a value (a drafter checkpoint, found by the hub)."""
        return None

    @classmethod
    def pairs(cls, models: Mapping[str, Path]) -> Mapping[str, Sequence[str]]:
        """For models at hand (name -> directory with config and tokenizer), those of them
        this method can draft with for each (`specgen models`); none unless it drafts
        with whole models."""
        return {}

    @classmethod
    def mounts(cls, count: int) -> bool:
        """Whether it runs with `count` drafter checkpoints."""
        return count == cls.drafters_needed

    @classmethod
    def mounts_text(cls) -> str:
        """How many --drafter it takes, for messages."""
        return str(cls.drafters_needed)

    @classmethod
    def registry_drafter(cls, drafters: Mapping[str, str]) -> str | tuple[str, ...] | None:
        """Its checkpoint(s) in a registry entry's drafters (method -> repo)."""
        return drafters.get(cls.name)

    @classmethod
    @abstractmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> DraftMethod:
        """Everything this method needs for `target`, from `drafters_needed` checkpoints."""
        ...

    @property
    def mounted(self) -> Mapping[str, DraftMethod]:
        """The drafters it drafts with, by name: whose draft times price its drafts."""
        return {self.name: self}

    @abstractmethod
    def new_drafter(self, capacity: int) -> Drafter:
        """A drafter with an empty context able to follow `capacity` target tokens."""
        ...


DRAFTERS: dict[str, type[DraftMethod]] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator: make a `DraftMethod` available as `--method NAME`."""

    def add(cls: type) -> type:
        if name in DRAFTERS or name == AR:
            raise ValueError(f"method {name!r} is already registered")
        cls.name = name
        DRAFTERS[name] = cls
        return cls

    return add


def checkpoint_free(source: str) -> bool:
    """Whether a drafter source (a --drafter value) names a method that loads no
    checkpoint (ngram, suffix): stacked mounts those by name beside checkpoints."""
    return source in DRAFTERS and DRAFTERS[source].drafters_needed == 0


def method_of(drafter_dir: Path) -> str:
    """The registered method whose checkpoints have this drafter's architecture."""
    if drafter_dir.is_file():  # weights alone (an MTP head): nothing says what they are
        raise CheckpointError(
            f"{drafter_dir}: a weights file without a config; give --method (--method mtp "
            "for a model's MTP layers)"
        )
    path = drafter_dir / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
        architectures = config.get("architectures") or []
    except (OSError, ValueError, AttributeError) as e:
        raise CheckpointError(f"{drafter_dir}: cannot read config.json ({e})") from None
    for name, cls in DRAFTERS.items():
        if cls.claims(config):
            return name
    raise CheckpointError(
        f"{drafter_dir}: not a drafter specgen knows (architectures {architectures}); "
        "give --method explicitly"
    )
