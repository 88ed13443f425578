"""A `SpecConfig` checked against the registered methods and the model registry, and the
draft method it names, loaded with its checkpoints resolved (downloaded) first."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specgen.core.config import AR, SpecConfig
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.drafting import Checkpoint, DraftMethod, checkpoint_free, method_of
from specgen.hub import Notify, packaged_drafters, resolve_drafter
from specgen.methods import METHODS, registered
from specgen.models.transformer import Transformer
from specgen.registry import MODELS


def checked_spec(spec: SpecConfig, model: str) -> SpecConfig:
    """The method exists; given drafters name their method; a method that needs drafters
    has them (the registry's for `model` when none were given)."""
    if spec.method not in METHODS:
        raise SpecgenError(f"unknown method {spec.method!r}; available: {', '.join(METHODS)}")
    if spec.is_ar and spec.drafter is None:
        return spec  # plain decoding: no method package is even imported
    drafters = registered()  # the registry, complete from here on
    if spec.is_ar and isinstance(spec.drafter, tuple):  # the method mounting as many
        fits = [m for m, cls in drafters.items() if cls.mounts(len(spec.drafter))]
        if not fits:
            raise SpecgenError(f"no method mounts {len(spec.drafter)} drafters")
        spec = replace(spec, method=fits[0])
    elif (
        isinstance(spec.drafter, str)
        and spec.method in (AR, spec.drafter)
        and (checkpoint_free(spec.drafter))
    ):  # `--drafter suffix`: the method of that name, which loads nothing
        spec = replace(spec, method=spec.drafter, drafter=None)
    elif spec.drafter is not None and spec.is_ar:  # the drafter says what it is
        own = located(spec.drafter)  # a source a method reads its own way stays as given
        if own is not None:
            spec = replace(spec, method=method_of(own), resolved=((spec.drafter, str(own)),))
        else:
            drafter_dir = resolve_drafter(spec.drafter)
            spec = replace(spec, method=method_of(drafter_dir), drafter=str(drafter_dir))
    elif isinstance(spec.drafter, str) and drafters[spec.method].variants:
        spec = _variant(spec)
    if spec.is_ar:
        return spec
    cls = drafters[spec.method]
    if spec.drafter is not None and not cls.mounts(len(_sources(spec))):
        raise SpecgenError(
            f"--method {spec.method} takes {cls.mounts_text()} --drafter, got {len(_sources(spec))}"
        )
    if spec.drafter is not None or not cls.needs_drafter:
        return spec
    entry = MODELS.get(model.lower())
    drafter = None if entry is None else cls.registry_drafter(entry.drafters)
    if drafter is None:
        raise SpecgenError(no_drafter(spec.method, model))
    return replace(spec, drafter=drafter)


def no_drafter(method: str, model: str) -> str:
    """What to pass instead: a drafter of this method that ships with specgen for `model`
    but that its alias does not pair (the default's EAGLE-3), else any."""
    shipped = [d for d in packaged_drafters(model) if method_of(resolve_drafter(d)) == method]
    if shipped:
        return (
            f"{model} pairs no {method} drafter by default, but specgen ships one: "
            f"pass --drafter {shipped[0]}"
        )
    return f"no {method} drafter is known for {model}; pass --drafter PATH|REPO"


def _variant(spec: SpecConfig) -> SpecConfig:
    """A method given a checkpoint of one of its `variants` runs it as that variant (e.g.
    `--method dflash` with a DFlash 2 drafter runs dflash2, reported so)."""
    drafter_dir = resolve_drafter(spec.drafter)
    resolved = replace(spec, resolved=((spec.drafter, str(drafter_dir)),))
    try:
        kind = method_of(drafter_dir)
    except SpecgenError:
        return resolved  # left to the method's loader, as `_check_kind` does
    if kind in registered()[spec.method].variants:
        return replace(resolved, method=kind, drafter=str(drafter_dir))
    return resolved


def located(source: str) -> Path | None:
    """Where a method that reads `source` its own way (a draft model's alias or GGUF
    file) finds it; None when none does."""
    for cls in registered().values():
        found = cls.locate(source)
        if found is not None:
            return found
    return None


def locate(source: str) -> Path:
    """A --drafter value on disk: what a method locates itself, else a drafter checkpoint."""
    found = located(source)
    return resolve_drafter(source) if found is None else found


def _sources(spec: SpecConfig) -> tuple[str, ...]:
    """The drafter checkpoints `spec` names (none, one, or a tuple of them)."""
    if spec.drafter is None:
        return ()
    return spec.drafter if isinstance(spec.drafter, tuple) else (spec.drafter,)


def load_method(
    target: Transformer, spec: SpecConfig, target_name: str, notify: Notify | None = None
) -> DraftMethod:
    """`spec`'s draft method for `target`, its checkpoints resolved (downloaded) first."""
    found = dict(spec.resolved)
    checkpoints = [  # a method named instead of a checkpoint is mounted by its name (stacked)
        Checkpoint(Path(found[s]) if s in found else locate(s), s)
        for s in _sources(spec)
        if not checkpoint_free(s)
    ]
    drafters = registered()
    if drafters[spec.method].drafters_needed == 1:
        _check_kind(spec.method, checkpoints[0])
    return drafters[spec.method].load(
        target, spec, checkpoints, target_name=target_name, notify=notify
    )


def _check_kind(method: str, checkpoint: Checkpoint) -> None:
    """A checkpoint whose config names another method is refused: run as `method` it
    would silently draft with the wrong layout (DSpark's shares DFlash's backbone, so it
    even loads). One whose architecture specgen does not know is left to `method`'s loader:
    naming the method is how such a checkpoint is run at all."""
    try:
        kind = method_of(checkpoint.path)
    except SpecgenError:
        return
    if kind != method:
        raise CheckpointError(
            f"{checkpoint.name} is a {kind} drafter (its config.json says so), not a "
            f"{method} one: run it as {kind} (leave --method out), or give a {method} drafter"
        )
