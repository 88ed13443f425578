"""`specgen models` and `specgen pull`: what is known, what is here, and fetching it."""

from __future__ import annotations

from typing import Annotated

import typer

from specgen import display
from specgen.cli.common import quiet_libraries, user_errors
from specgen.cli.options import DebugOpt, JsonOpt, Run
from specgen.errors import ModelNotFoundError
from specgen.registry import DEFAULT_ALIAS, MODELS, ModelEntry


def _status(entry: ModelEntry) -> str:
    from specgen.hub import cached_snapshot, embedded_gguf

    if cached_snapshot(entry.repo) is not None:
        return "downloaded"
    if embedded_gguf(entry) is not None:
        return "embedded GGUF (offline)"
    return "not downloaded"


def models(json_out: JsonOpt = False, debug: DebugOpt = Run.debug) -> None:
    """List model aliases, their drafters, and whether they are available offline."""
    with user_errors(debug):
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
        if json_out:
            for row in rows:
                display.write_json(row)
        else:
            display.show(display.models_table(rows))


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
            path = download(repo, alias=entry.alias)
            display.status(f"{repo} -> {path}")
