"""`--method stacked`: two or more drafters (any mix of DFlash, DSpark, DFlash 2 and
EAGLE-3 checkpoints, and the copy drafters ngram and suffix, named instead of a
checkpoint: `--drafter suffix`) mounted on one target.

One capture of target features feeds them all: the target taps the union of their layers
and every drafter's context (a block drafter's context cache, EAGLE-3's own KV cache and
fused features) is extended with every committed token and rolled back with the target,
whichever drafter drafted, so any of them can draft the next step. The drafters are the
options (buckets 0, 1, ...) the scheduler chooses between before each step
(`scheduling/scheduler.py`) by each one's own measured steps; the chosen drafter's draft
goes through the one shared verify, and a DSpark draft keeps its confidences, so the
verify-length scheduler still trims it. The choice never looks at the tokens it will be
judged on, so the output is exact. Without a scheduler the first drafter drafts every step.

A copy drafter's draft is free (a lookup, no network), so it is looked at before the
choice (`options_at`) and offered only where it has one, as an option of the kind it
drafted (suffix's match class, ngram's match length), priced by what drafts of that kind
earned before: where the text repeats its long matches win, elsewhere the learned drafter
drafts. The lookup reads committed tokens only, so the choice still never sees what it
will be judged on. A registry entry's stacked mounts its learned drafters and suffix.

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
    checkpoint_free,
    method_of,
    register,
)

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


COPY = "suffix"  # the copy drafter a registry entry's stacked mounts beside its own
# a free drafter's kinds of draft are offered as buckets FREE_BUCKETS * (its place + 1) +
# its own bucket, apart from the other drafters' (their place)
FREE_BUCKETS = 1000


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
        """All of a registry entry's drafters (every one a single-drafter method) and the
        copy drafter `COPY` (it loads nothing and is looked at only where it has a draft),
        when that makes two or more."""
        found = tuple(p for m, p in drafters.items() if m in DRAFTERS and _single(m))
        found += (COPY,) if found and COPY in DRAFTERS else ()
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
        """The drafters `spec.drafter` names, in its order: `checkpoints` for those given
        as checkpoints, and the methods that load none (ngram, suffix) by their names."""
        sources = spec.drafter if isinstance(spec.drafter, tuple) else (spec.drafter,)
        sources = tuple(s for s in sources if s is not None)
        named = [s for s in sources if checkpoint_free(s)]
        if not cls.mounts(len(checkpoints) + len(named)):
            raise SpecgenError(
                "--method stacked needs two or more drafters: --drafter A --drafter B [...]"
            )
        _refuse_repeats(checkpoints, named)
        kinds = [method_of(c.path) for c in checkpoints]
        for kind, checkpoint in zip(kinds, checkpoints, strict=True):
            if not _single(kind):
                raise CheckpointError(
                    f"{checkpoint.name} is a {kind} checkpoint; stacked mounts drafters of "
                    "one checkpoint each (dflash, dflash2, dspark, eagle3) and the methods "
                    "that load none (ngram, suffix)"
                )
        given: list[tuple[str, Checkpoint | None]] = list(zip(kinds, checkpoints, strict=True))
        parts = given + [(n, None) for n in named]
        if len(sources) == len(parts):  # in the order given
            rest = iter(given)
            parts = [(s, None) if s in named else next(rest) for s in sources]
        methods = [
            DRAFTERS[k].load(
                target,
                replace(spec, method=k, drafter=None, block_size=None),
                () if c is None else (c,),
                target_name=target_name,
                notify=notify,
            )
            for k, c in parts
        ]
        return cls(_names([k for k, _ in parts]), methods)

    @property
    def mounted(self) -> Mapping[str, DraftMethod]:
        return dict(zip(self.names, self.methods, strict=True))

    def new_drafter(self, capacity: int) -> StackedDrafter:
        return StackedDrafter(self, capacity)


def _single(kind: str) -> bool:
    return DRAFTERS[kind].drafters_needed == 1


def _refuse_repeats(checkpoints: Sequence[Checkpoint], named: Sequence[str] = ()) -> None:
    """One drafter given twice would only double its cost: it drafts the same."""
    for name in set(named):
        if named.count(name) > 1:
            raise CheckpointError(f"stacked got {name} twice: give each --drafter once")
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
        self._previews: dict[int, Draft] = {}  # free drafters' drafts at this anchor

    def tensors(self) -> list[torch.Tensor]:
        return [t for d in self.drafters for t in d.tensors()]

    def options_at(self, anchor: int, params: SamplingParams) -> tuple[DraftOption, ...]:
        """A free drafter (ngram, suffix) is looked at first: it is offered only where it
        has a draft, as an option of the kind it drafted (its bucket: e.g. suffix's match
        class), so the choice weighs what that kind of draft earned before; the others are
        offered as they are. All of it is known before any token is verified."""
        self._previews = {}
        options = []
        for i, d in enumerate(self.drafters):
            if not d.free:
                options.append(self.options[i])
                continue
            draft = d.propose(anchor, d.max_draft_tokens, params, None)
            if draft.length:
                bucket = FREE_BUCKETS * (i + 1) + draft.bucket
                self._previews[bucket] = draft
                options.append(DraftOption(bucket=bucket, source=self.names[i]))
        return tuple(options)

    def select(self, bucket: int) -> None:
        self._selected = bucket

    def _chosen(self) -> int:
        chosen, self._selected = self._selected, None
        return 0 if chosen is None else chosen

    def _mark(self, draft: Draft, chosen: int) -> Draft:
        return replace(draft, bucket=chosen, source=self.names[chosen])

    def _previewed(self, chosen: int, max_tokens: int) -> Draft | None:
        """The free draft `options_at` offered under bucket `chosen`, cut to `max_tokens`."""
        draft = self._previews.get(chosen)
        self._previews = {}
        if draft is None:
            return None
        name = self.names[chosen // FREE_BUCKETS - 1]
        return replace(draft.truncated(max_tokens), bucket=chosen, source=name)

    def rollback(self, length: int) -> None:
        self._selected = None  # an interrupted step chose for nothing
        self._previews = {}
        for d in self.drafters:
            d.rollback(length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        for d in self.drafters:
            d.observe(tokens, {i: taps[i] for i in d.taps})

    def answered(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        for d in self.drafters:
            d.answered(prompt, answer)

    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams,
        generator: torch.Generator | None,
    ) -> Draft:
        chosen = self._chosen()
        previewed = self._previewed(chosen, max_tokens)
        if previewed is not None:
            return previewed
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
