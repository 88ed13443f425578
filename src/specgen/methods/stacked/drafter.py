"""`--method stacked`: two or more drafters (any mix of DFlash, DSpark, DFlash 2 and
EAGLE-3 checkpoints) mounted on one target.

One capture of target features feeds them all: the target taps the union of their layers
and every drafter's context (a block drafter's context cache, EAGLE-3's own KV cache and
fused features) is extended with every committed token and rolled back with the target,
whichever drafter drafted, so any of them can draft the next step. The drafters are the
options (buckets 0, 1, ...) the scheduler chooses between before each step
(`scheduling/scheduler.py`) by each one's own measured steps; the chosen drafter's draft
goes through the one shared verify, and a DSpark draft keeps its confidences, so the
verify-length scheduler still trims it. The choice never looks at the tokens it will be
judged on, so the output is exact. Without a scheduler the first drafter drafts every step.

The drafters' kinds are read from their checkpoints; each is validated against the target
as it would be alone. A drafter is named by its kind (in stats, traces, cost tables), or
by its kind and its place among those of that kind when several share one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from specgen.core.draft import Draft, DraftOption
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.drafting.base import (
    DRAFTERS,
    Checkpoint,
    Drafter,
    DraftMethod,
    ResidentDrafter,
    method_of,
    register,
)

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


@register("stacked")
class StackedMethod(DraftMethod):
    drafters_needed = 2  # at least

    @classmethod
    def mounts(cls, count: int) -> bool:
        return count >= cls.drafters_needed

    @classmethod
    def mounts_text(cls) -> str:
        return f"{cls.drafters_needed} or more"

    @classmethod
    def registry_drafter(cls, drafters: Mapping[str, str]) -> tuple[str, ...] | None:
        """All of a registry entry's drafters (every one a single-drafter method), when it
        has two or more."""
        found = tuple(p for m, p in drafters.items() if m in DRAFTERS and _single(m))
        return found if cls.mounts(len(found)) else None

    def __init__(self, names: Sequence[str], methods: Sequence[DraftMethod]) -> None:
        self.names = tuple(names)
        self.methods = tuple(methods)
        self.max_draft_tokens = max(m.max_draft_tokens for m in methods)
        self.cache_key = " + ".join(m.cache_key for m in methods)

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> StackedMethod:
        if not cls.mounts(len(checkpoints)):
            raise SpecgenError(
                "--method stacked needs two or more drafters: --drafter A --drafter B [...]"
            )
        _refuse_repeats(checkpoints)
        kinds = [method_of(c.path) for c in checkpoints]
        for kind, checkpoint in zip(kinds, checkpoints, strict=True):
            if not _single(kind):
                raise CheckpointError(
                    f"{checkpoint.name} is a {kind} checkpoint; stacked mounts drafters of "
                    "one checkpoint each (dflash, dflash2, dspark, eagle3)"
                )
        methods = [
            DRAFTERS[k].load(
                target,
                replace(spec, method=k, block_size=None),
                (c,),
                target_name=target_name,
                notify=notify,
            )
            for k, c in zip(kinds, checkpoints, strict=True)
        ]
        return cls(_names(kinds), methods)

    @property
    def mounted(self) -> Mapping[str, DraftMethod]:
        return dict(zip(self.names, self.methods, strict=True))

    def new_drafter(self, capacity: int) -> StackedDrafter:
        return StackedDrafter(self, capacity)


def _single(kind: str) -> bool:
    return DRAFTERS[kind].drafters_needed == 1


def _refuse_repeats(checkpoints: Sequence[Checkpoint]) -> None:
    """One checkpoint given twice would only double its cost: it drafts the same."""
    seen: dict[Path, str] = {}
    for c in checkpoints:
        where = c.path.resolve()
        if where in seen:
            raise CheckpointError(
                f"stacked got the same drafter twice ({seen[where]} and {c.name}): "
                "give each --drafter once"
            )
        seen[where] = c.name


def _names(kinds: Sequence[str]) -> list[str]:
    """Each drafter's name: its kind, or `kind-1`, `kind-2`, ... where several share one."""
    count = Counter(kinds)
    seen: Counter[str] = Counter()
    names = []
    for kind in kinds:
        seen[kind] += 1
        names.append(kind if count[kind] == 1 else f"{kind}-{seen[kind]}")
    return names


class StackedDrafter(ResidentDrafter):
    def __init__(self, method: StackedMethod, capacity: int) -> None:
        self.names = method.names
        self.drafters: list[Drafter] = [m.new_drafter(capacity) for m in method.methods]
        self.taps = tuple(sorted(set().union(*(d.taps for d in self.drafters))))
        self.max_draft_tokens = method.max_draft_tokens
        self.resident = all(d.resident for d in self.drafters)
        self.options = tuple(
            DraftOption(bucket=i, source=name, confidences=any(o.confidences for o in d.options))
            for i, (name, d) in enumerate(zip(self.names, self.drafters, strict=True))
        )
        self._selected: int | None = None  # the scheduler's pick for the next draft

    def tensors(self) -> list[torch.Tensor]:
        return [t for d in self.drafters for t in d.tensors()]

    def select(self, bucket: int) -> None:
        self._selected = bucket

    def _chosen(self) -> int:
        chosen, self._selected = self._selected, None
        return 0 if chosen is None else chosen

    def _mark(self, draft: Draft, chosen: int) -> Draft:
        return replace(draft, bucket=chosen, source=self.names[chosen])

    def rollback(self, length: int) -> None:
        self._selected = None  # an interrupted step chose for nothing
        for d in self.drafters:
            d.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        for d in self.drafters:
            d.observe(tokens, {i: taps[i] for i in d.taps})

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        chosen = self._chosen()
        draft = self.drafters[chosen].propose(anchor, max_tokens, params, generator)
        return self._mark(draft, chosen)

    # The device-resident loop (engine/resident.py), when every drafter can be driven by it.

    def _resident(self) -> list[ResidentDrafter]:
        assert self.resident, "the resident loop drives only drafters that are resident"
        return [cast(ResidentDrafter, d) for d in self.drafters]

    def begin_resident(self) -> None:
        for d in self._resident():
            d.begin_resident()

    def draft_at(
        self,
        anchor: torch.Tensor,
        start: torch.Tensor,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        chosen = self._chosen()
        draft = self._resident()[chosen].draft_at(anchor, start, k, params, generator)
        return self._mark(draft, chosen)

    def observe_at(
        self, tokens: torch.Tensor, taps: Mapping[int, torch.Tensor], start: torch.Tensor
    ) -> None:
        for d in self._resident():
            d.observe_at(tokens, {i: taps[i] for i in d.taps}, start)

    def assume(self, length: int) -> None:
        for d in self._resident():
            d.assume(length)
