"""Several decoding methods on one loaded target (`specgen bench`, `specgen serve
--methods`): the first method loads the target, the others share its weights
(`Pipeline.with_spec`), and the drafter checkpoints given go each to the method of its kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from specgen.api.pipeline import Pipeline
from specgen.api.spec import located
from specgen.core.config import SpecConfig
from specgen.core.errors import SpecgenError
from specgen.drafting import method_of
from specgen.hub import Notify, resolve_drafter
from specgen.methods import DRAFTERS

Drafters = str | tuple[str, ...]  # one method's checkpoint, or stacked's several


def drafters_by_kind(drafters: Sequence[str]) -> dict[str, str]:
    """Each drafter checkpoint given (resolved, downloaded) by the method its config names;
    two of one kind are refused, as no method would know which to take."""
    by_kind: dict[str, str] = {}
    for path in drafters:
        own = located(path)  # a draft model's alias or GGUF file stays as given
        directory = resolve_drafter(path) if own is None else own
        kind = method_of(directory)
        if kind in by_kind:
            raise SpecgenError(f"two --drafter of kind {kind}: give one per method")
        by_kind[kind] = str(directory) if own is None else path
    return by_kind


def drafters_by_method(by_kind: Mapping[str, str], names: Sequence[str]) -> dict[str, Drafters]:
    """Each of `names`' checkpoints among `by_kind`, found as the method finds its own in a
    registry entry (stacked: the DFlash and the DSpark one). A checkpoint that no method
    in `names` takes is refused, never silently left out."""
    given = {m: DRAFTERS[m].registry_drafter(by_kind) for m in names if m in DRAFTERS}
    used = {p for d in given.values() if d for p in ((d,) if isinstance(d, str) else d)}
    unused = [kind for kind, path in by_kind.items() if path not in used]
    if unused:
        raise SpecgenError(f"--drafter of kind {unused[0]} given, but --methods has no {unused[0]}")
    return {m: d for m, d in given.items() if d}


def load_methods(
    names: Sequence[str],
    load: Callable[[SpecConfig], Pipeline],
    *,
    settings: SpecConfig | None = None,
    drafters: Mapping[str, str] | None = None,
    notify: Notify | None = None,
    measure_costs: bool = False,
) -> dict[str, Pipeline]:
    """A pipeline per method of `names` (method -> pipeline, in that order): `load` loads
    the target with the first one's spec (e.g. `Pipeline.load` with the model and device
    bound), the others are on its weights. Every spec is `settings` (engine, verify policy,
    draft knobs; its method and drafter are ignored) with its method and its checkpoints
    from `drafters` (`drafters_by_kind`; none given: the registry's). The checkpoints are
    matched to the methods before anything loads, so a stray one fails fast."""
    settings = settings or SpecConfig()
    given = drafters_by_method(drafters or {}, names)

    def spec(name: str) -> SpecConfig:
        return replace(settings, method=name, drafter=given.get(name))

    base = load(spec(names[0]))
    pipes = {names[0]: base}
    for name in names[1:]:
        pipes[name] = base.with_spec(spec(name), notify=notify, measure_costs=measure_costs)
    return pipes
