"""The draft method: a smaller causal LM drafts for the target. Its drafter module registers
it as `--method draft` (`specgen.methods.registered` imports it on first use); the rules for
`--draft-model` live here, torch-free, so that an option error costs no import."""

from __future__ import annotations

from specgen.core.errors import SpecgenError

NAME = "draft"
MOUNTED_BY = "stacked"  # the one method that mounts a draft model beside other drafters


def with_draft_model(
    method: str | None, drafters: list[str] | None, draft_model: str
) -> tuple[str, list[str]]:
    """The method and drafter list that `--draft-model` asks for with the `--method` and
    `--drafter` given: the draft model alone (`--method draft`, the default), or beside
    other drafters (`--method stacked`)."""
    if method not in (None, NAME, MOUNTED_BY):
        raise SpecgenError(
            f"--draft-model drafts with --method {NAME} or {MOUNTED_BY}, not {method}"
        )
    if drafters and method != MOUNTED_BY:
        raise SpecgenError(f"--draft-model and --drafter together need --method {MOUNTED_BY}")
    return method or NAME, [*(drafters or []), draft_model]
