"""`--method stacked`: two drafters (DFlash and DSpark) mounted on one target.

One capture of target features feeds both: the target taps the union of their layers
and each drafter's context cache is extended with every committed token (and rolled back
with the target), so either can draft the next step. Under the cost policy the scheduler
picks, before each step, the drafter whose own last steps gave the most tokens per second
(`scheduling/acceptance.OwnSteps`, priced with its measured draft time; the one drafting
keeps drafting unless the other is clearly faster), and drafts with it when its own price
says a draft beats a plain decoding step (`VerifyScheduler.pick`); the drafters are its
two options, buckets 0 and 1. Under the other policies the selector
(`scheduling/selector.py`) picks from committed tokens per step. The chosen drafter's
draft goes through the shared verifier, and a DSpark draft keeps its confidences, so the
verify-length scheduler still trims it. The choice never looks at the tokens it will be
judged on, so the output is exact.

The two are found by their checkpoints' kinds (any two different registered drafter
methods); each is validated against the target as it would be alone.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from specgen.drafting.base import (
    DRAFTERS,
    Draft,
    DraftMethod,
    DraftOption,
    method_of,
    register,
)
from specgen.errors import CheckpointError, SpecgenError
from specgen.hub import resolve_drafter
from specgen.scheduling.cost import cached_costs
from specgen.scheduling.selector import DrafterRecord, choose_drafter, record_step

if TYPE_CHECKING:
    from specgen.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer

MOUNTED = ("dflash", "dspark")  # the registry's drafters a stacked alias uses


@register("stacked")
class StackedMethod:
    architectures: tuple[str, ...] = ()  # never inferred from one checkpoint
    needs_drafter = True
    drafters_needed = 2

    @classmethod
    def registry_drafter(cls, drafters: Mapping[str, str]) -> tuple[str, ...] | None:
        found = tuple(drafters[m] for m in MOUNTED if m in drafters)
        return found if len(found) == 2 else None

    def __init__(
        self,
        names: Sequence[str],
        methods: Sequence[DraftMethod],
        draft_seconds: Sequence[float],
        step_seconds: Sequence[float],
        draft_by_length: Sequence[tuple[float, ...]] = (),
    ) -> None:
        self.names = tuple(names)
        self.methods = tuple(methods)
        self.draft_seconds = tuple(draft_seconds)  # each drafter's longest draft
        self.draft_by_length = tuple(draft_by_length) or ((),) * len(self.methods)
        self.step_seconds = tuple(step_seconds)
        self.max_draft_tokens = max(m.max_draft_tokens for m in methods)

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> StackedMethod:
        if not isinstance(spec.drafter, tuple) or len(spec.drafter) != 2:
            raise SpecgenError("--method stacked needs two drafters: --drafter A --drafter B")
        dirs = [resolve_drafter(d) for d in spec.drafter]
        kinds = [method_of(d) for d in dirs]
        if kinds[0] == kinds[1] or not all(DRAFTERS[k].drafters_needed == 1 for k in kinds):
            raise CheckpointError(
                f"stacked needs two drafters of different kinds (e.g. dflash + dspark), "
                f"got {kinds[0]} + {kinds[1]}"
            )
        methods = [
            DRAFTERS[k].load(
                target,
                replace(spec, method=k, drafter=str(d), block_size=None),
                target_name=target_name,
                notify=notify,
            )
            for k, d in zip(kinds, dirs, strict=True)
        ]
        # measured once and cached: each drafter's time per step, the target's verify times
        longest = max(m.max_draft_tokens for m in methods)
        tables = [
            cached_costs(
                target,
                f"stacked|{target_name}",
                longest,
                notify,
                method=m,
                drafter_key=f"{k}|{d}|{spec.draft_tokens}",
                graphs=spec.cuda_graphs,
            )
            for k, d, m in zip(kinds, dirs, methods, strict=True)
        ]
        steps = tables[0].step_seconds(tables[0].contexts[0])
        seconds = [t.draft_seconds for t in tables]
        return cls(kinds, methods, seconds, steps, [t.draft_by_length for t in tables])

    def new_drafter(self, capacity: int) -> StackedDrafter:
        return StackedDrafter(self, capacity)


class StackedDrafter:
    def __init__(self, method: StackedMethod, capacity: int) -> None:
        self.method = method
        self.drafters = [m.new_drafter(capacity) for m in method.methods]
        self.taps = tuple(sorted(set().union(*(d.taps for d in self.drafters))))
        self.max_draft_tokens = method.max_draft_tokens
        self.records = tuple(DrafterRecord() for _ in self.drafters)
        self.step = 0
        self._pending: tuple[int, int] | None = None  # (drafter, draft length) in flight
        self._selected: int | None = None  # picked by the scheduler for the next draft
        self._in_flight: deque[tuple[int, int]] = deque()  # the resident loop's pendings
        self.options = tuple(
            DraftOption(
                bucket=i,
                seconds=seconds,
                by_length=by_length,
                confidences=any(o.confidences for o in getattr(d, "options", ())),
            )
            for i, (d, seconds, by_length) in enumerate(
                zip(self.drafters, method.draft_seconds, method.draft_by_length, strict=True)
            )
        )

    def forget(self) -> None:
        """Back to the selector's prior, as a new drafter (for a seeded answer, whose tokens
        must not depend on the answers before it)."""
        self.records = tuple(DrafterRecord() for _ in self.drafters)
        self.step = 0

    def select(self, bucket: int) -> None:
        """The scheduler's pick for the next `propose` (an option's bucket: the drafter)."""
        self._selected = bucket

    def rollback(self, length: int) -> None:
        self._pending = self._selected = None  # an interrupted step is evidence of nothing
        self._in_flight.clear()
        for d in self.drafters:
            d.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        for d in self.drafters:
            d.observe(tokens, {i: taps[i] for i in d.taps})
        if self._pending is not None:  # a step's observe: [anchor, *accepted drafts]
            chosen, proposed = self._pending
            self.records = record_step(self.records, chosen, self.step, len(tokens), proposed)
            self._pending = None

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        chosen = self._choose()
        draft = self.drafters[chosen].propose(anchor, max_tokens, params, generator)
        self._pending = (chosen, draft.length)
        return replace(draft, bucket=chosen, source=self.method.names[chosen])

    def _choose(self) -> int:
        self.step += 1
        chosen = self._selected
        if chosen is None:  # no cost scheduler picked: the selector's choice
            chosen = choose_drafter(
                self.records,
                step=self.step,
                draft_seconds=self.method.draft_seconds,
                step_seconds=self.method.step_seconds,
            )
        self._selected = None
        return chosen

    # The device-resident loop (engine/resident.py; see drafting/static_draft.py). Its
    # steps are recorded for the selector when the host learns them, a step late.

    @property
    def resident(self) -> bool:
        return all(getattr(d, "resident", False) for d in self.drafters)

    def begin_resident(self) -> None:
        self._in_flight.clear()
        for d in self.drafters:
            d.begin_resident()

    def draft_at(
        self,
        anchor: torch.Tensor,
        start: torch.Tensor,
        k: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        chosen = self._choose()
        draft = self.drafters[chosen].draft_at(anchor, start, k, params, generator)
        self._in_flight.append((chosen, draft.length))
        return replace(draft, bucket=chosen, source=self.method.names[chosen])

    def observe_at(self, taps: Mapping[int, torch.Tensor], start: torch.Tensor) -> None:
        for d in self.drafters:
            d.observe_at({i: taps[i] for i in d.taps}, start)

    def assume(self, length: int, committed: int | None = None) -> None:
        """As each drafter's; `committed`: tokens a drafted step committed (the oldest in
        flight), for the selector."""
        for d in self.drafters:
            d.assume(length)
        if committed is not None and self._in_flight:
            chosen, proposed = self._in_flight.popleft()
            self.records = record_step(self.records, chosen, self.step, committed, proposed)
