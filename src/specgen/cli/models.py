"""`specgen models` and `specgen pull`: what is known, what is here, and fetching it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specgen.cli.common import quiet_libraries, user_errors
from specgen.cli.options import DebugOpt, DequantizeOpt, JsonOpt, QuantizeOpt, Run
from specgen.core.errors import ModelNotFoundError
from specgen.registry import DEFAULT_ALIAS, MODELS, ModelEntry
from specgen.terminal import display


def _status(entry: ModelEntry) -> str:
    from specgen.hub import cached_snapshot, embedded_gguf

    if cached_snapshot(entry.repo) is not None:
        return "downloaded"
    if embedded_gguf(entry) is not None:
        return "embedded GGUF (offline)"
    return "not downloaded"


def models(
    model: Annotated[
        str | None,
        typer.Argument(help="Load this model (alias, path, .gguf) and say what its weights are."),
    ] = None,
    quantize: QuantizeOpt = None,
    dequantize: DequantizeOpt = False,
    json_out: JsonOpt = False,
    debug: DebugOpt = Run.debug,
) -> None:
    """List model aliases, their drafters, and whether they are available offline; with a
    MODEL, load it and report how its weights are held (format, bits, bytes resident)."""
    with user_errors(debug):
        if model is not None:
            return _weights(model, quantize, dequantize, json_out)
        rows = []
        for entry in MODELS.values():
            rows.append(
                {
                    "alias": entry.alias,
                    "default": entry.alias == DEFAULT_ALIAS,
                    "repo": entry.repo,
                    "drafters": [{"method": m, "repo": r} for m, r in entry.drafters.items()],
                    "thinking": entry.thinking,  # the mode its drafters were trained with
                    "status": _status(entry),
                }
            )
        pairings = _pairings()  # what is at hand now: read once per command
        for row in rows:
            paired = pairings.get(row["alias"], {})
            row["drafters"] += [{"method": m, "repo": r} for m, r in paired.items()]
        if json_out:
            for row in rows:
                display.write_json(row)
        else:
            display.show(display.models_table(rows))


def _at_hand() -> dict[str, Path]:
    """The models here (name -> directory of config and tokenizer): the aliases downloaded
    or embedded, then the other repos in the Hugging Face cache. Only when two or more are
    here (a pairing needs two): an embedded GGUF's config and tokenizer are then read out
    of it, which imports what `specgen models` alone does not need."""
    from specgen.hub import cached_snapshot, embedded_gguf, hub_cache

    found: dict[str, Path] = {}
    for entry in MODELS.values():
        snapshot = cached_snapshot(entry.repo)
        gguf = None if snapshot is not None else embedded_gguf(entry)
        if snapshot is not None or gguf is not None:
            found[entry.alias] = snapshot or gguf
    aliased = {e.repo.lower() for e in MODELS.values()}
    cache = hub_cache()
    for folder in sorted(cache.glob("models--*--*")) if cache.is_dir() else []:
        repo = folder.name.removeprefix("models--").replace("--", "/", 1)
        snapshot = None if repo.lower() in aliased else cached_snapshot(repo)
        if snapshot is not None:
            found[repo] = snapshot
    if len(found) < 2:
        return found
    from specgen.models.formats.gguf.convert import ensure_converted

    return {name: ensure_converted(p) if p.suffix == ".gguf" else p for name, p in found.items()}


def _pairings() -> dict[str, dict[str, str]]:
    """For each model at hand, a drafter of each method that drafts with whole models
    (the draft method: the smallest model of the same vocabulary), when two or more are
    here."""
    models = _at_hand()
    if len(models) < 2:
        return {}
    from specgen.methods import registered

    out: dict[str, dict[str, str]] = {}
    for name, cls in registered().items():
        for target, drafts in cls.pairs(models).items():
            out.setdefault(target, {})[name] = drafts[0]
    return out


def _weights(model: str, quantize: str | None, dequantize: bool, json_out: bool) -> None:
    quiet_libraries()
    from specgen.api.loader import load_weights
    from specgen.core.device import resolve_device, resolve_dtype
    from specgen.hub import resolve_model
    from specgen.models.formats.weights import describe_weights

    resolved = resolve_model(model, notify=None if json_out else display.status)
    dev = resolve_device("cpu")
    target = load_weights(
        resolved,
        resolve_dtype("auto", dev),
        dev,
        quantize=quantize,
        dequantize=dequantize,
        notify=None if json_out else display.status,
    )
    row = {"model": resolved.name, **describe_weights(target)}
    if resolved.gguf is not None:
        row["file_bytes"] = resolved.gguf.stat().st_size
    if json_out:
        display.write_json(row)
        return
    kinds = ", ".join(f"{k} x{n}" for k, n in row["formats"].items())
    size = f"{row['resident_bytes'] / 2**20:.1f} MiB resident"
    if "file_bytes" in row:
        size += f" (file {row['file_bytes'] / 2**20:.1f} MiB)"
    display.status(
        f"{row['model']}: {kinds}; {row['matrix_bits_per_weight']} bits per matrix weight; {size}"
    )


def pull(
    alias: Annotated[str, typer.Argument(help="A model alias (see `specgen models`).")],
    drafters: Annotated[
        bool, typer.Option("--drafters/--no-drafters", help="Also fetch the alias's drafters.")
    ] = True,
    debug: DebugOpt = Run.debug,
) -> None:
    """Download a model (and its drafters) into the Hugging Face cache, with progress."""
    with user_errors(debug):
        quiet_libraries()
        from specgen.hub import PACKAGED, download

        entry = MODELS.get(alias.lower())
        if entry is None:
            known = ", ".join(MODELS)
            raise ModelNotFoundError(f"unknown model {alias!r}; known aliases: {known}")
        repos = [entry.repo] + (list(entry.drafters.values()) if drafters else [])
        for repo in repos:
            if repo.startswith(PACKAGED):
                display.status(f"{repo} ships with specgen")
                continue
            display.status(f"fetching {repo}")
            path = download(repo, alias=entry.alias, pulling=True)
            display.status(f"{repo} -> {path}")
