"""Resolve what the user typed for --model into a local HF-format directory.

This is the only module that touches the network. Resolution order:

1. an existing path: a directory with config.json, a `.gguf` file, or a directory holding
   exactly one `.gguf`;
2. a registry alias: its Hub repo if it is already in the local Hugging Face cache, else
   the GGUF embedded in a pip package (the default model, so a fresh machine works
   offline), else a download;
3. anything shaped like `org/name`: a Hub repo, downloaded or taken from the cache.

Downloads go through `huggingface_hub.snapshot_download` (its cache, `HF_HOME`,
`HF_TOKEN`, progress bars) and fetch only config, tokenizer and safetensors files.
`HF_HUB_OFFLINE=1` forbids the network; an uncached repo then fails with one line.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specgen.core.errors import ModelNotFoundError
from specgen.models.formats.gguf.convert import ensure_converted
from specgen.registry import MODELS, ModelEntry

ALLOW_PATTERNS = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "*.safetensors",
    "*.safetensors.index.json",
]

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

Notify = Callable[[str], None]


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # an HF-format directory: config.json, safetensors, tokenizer files
    name: str  # what to call it in messages
    source: str  # "local", "gguf", "hub-cache", "embedded" or "download"
    gguf: Path | None = None  # a GGUF target's file (`path` then holds config + tokenizer)


def _is_repo_id(spec: str) -> bool:
    """`org/name`, and not a relative path that merely looks like one."""
    return bool(_REPO_ID.match(spec)) and not spec.startswith((".", "~"))


def is_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_model(spec: str, *, notify: Notify | None = None) -> ResolvedModel:
    """Turn an alias, path or repo id into a local model directory (downloading if needed)."""
    path = Path(spec).expanduser()
    if path.exists():
        return _resolve_path(path, spec, notify)
    entry = MODELS.get(spec.lower())
    if entry is not None:
        return _resolve_alias(entry, notify)
    if _is_repo_id(spec):
        return ResolvedModel(download(spec), spec, "download")
    if "/" in spec or spec.endswith(".gguf"):
        raise ModelNotFoundError(f"{spec}: no such file or directory")
    known = ", ".join(MODELS)
    raise ModelNotFoundError(
        f"unknown model {spec!r}; use an alias ({known}), a local path or a Hub repo id"
    )


def _resolve_path(path: Path, spec: str, notify: Notify | None) -> ResolvedModel:
    if path.is_file() and path.suffix == ".gguf":
        return ResolvedModel(ensure_converted(path, notify), spec, "gguf", path)
    if path.is_dir():
        if (path / "config.json").is_file():
            return ResolvedModel(path, spec, "local")
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ResolvedModel(ensure_converted(ggufs[0], notify), spec, "gguf", ggufs[0])
    raise ModelNotFoundError(
        f"{spec}: not a model (expected a directory with config.json, or a .gguf file)"
    )


def _resolve_alias(entry: ModelEntry, notify: Notify | None) -> ResolvedModel:
    cached = cached_snapshot(entry.repo)
    if cached is not None:
        return ResolvedModel(cached, entry.alias, "hub-cache")
    gguf = embedded_gguf(entry)
    if gguf is not None:
        return ResolvedModel(ensure_converted(gguf, notify), entry.alias, "embedded", gguf)
    return ResolvedModel(download(entry.repo, alias=entry.alias), entry.alias, "download")


def embedded_gguf(entry: ModelEntry) -> Path | None:
    """The GGUF file shipped in a pip package, without importing that package."""
    if entry.embedded_gguf is None:
        return None
    package, file = entry.embedded_gguf
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(folder) / file
        if candidate.is_file():
            return candidate
    return None


def cached_snapshot(repo: str) -> Path | None:
    """The repo's snapshot in the local HF cache if it has config and weights, else None."""
    if not (hub_cache() / f"models--{repo.replace('/', '--')}").is_dir():
        return None  # said without importing huggingface_hub (a second of a cold start)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        path = Path(snapshot_download(repo, allow_patterns=ALLOW_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, OSError, ValueError):
        return None
    complete = (path / "config.json").is_file() and any(path.glob("*.safetensors"))
    return path if complete else None


def hub_cache() -> Path:
    """Where huggingface_hub keeps repos: its own setting once it is imported, else what
    it would read from the environment (HF_HUB_CACHE, HUGGINGFACE_HUB_CACHE, HF_HOME,
    XDG_CACHE_HOME), as its `constants` module does."""
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        return Path(constants.HF_HUB_CACHE)
    expand = lambda p: os.path.expandvars(os.path.expanduser(p))  # noqa: E731
    base = os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    home = expand(os.getenv("HF_HOME", os.path.join(base, "huggingface")))
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return Path(expand(os.getenv("HF_HUB_CACHE", legacy)))


def download(repo: str, *, alias: str | None = None, pulling: bool = False) -> Path:
    """Fetch config, tokenizer and safetensors of `repo` into the HF cache (or reuse it).
    `pulling`: this is `specgen pull` itself (an error then says how to reach the Hub,
    not to run the command being run)."""
    from huggingface_hub import snapshot_download

    offline = is_offline()
    how = None if pulling else f"`specgen pull {alias or repo}`"
    with _hub_errors(repo, how, offline):
        return Path(
            snapshot_download(repo, allow_patterns=ALLOW_PATTERNS, local_files_only=offline)
        )


def download_dataset_file(repo: str, filename: str) -> Path:
    """One file of a Hub dataset repo (e.g. a benchmark's questions), cached by the HF cache."""
    from huggingface_hub import hf_hub_download

    offline = is_offline()
    with _hub_errors(repo, None, offline):
        return Path(hf_hub_download(repo, filename, repo_type="dataset", local_files_only=offline))


@contextmanager
def _hub_errors(repo: str, how: str | None, offline: bool) -> Iterator[None]:
    """Turn huggingface_hub's exceptions into one-line errors naming the repo; `how`: the
    command that would fetch it (None: the one being run, which only needs the Hub)."""
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        yield
    except LocalEntryNotFoundError:
        if offline and how is None:
            raise ModelNotFoundError(
                f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
                "unset HF_HUB_OFFLINE to download it"
            ) from None
        if offline:
            raise ModelNotFoundError(
                f"{repo} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; "
                f"run {how} with network access first"
            ) from None
        if how is None:
            raise ModelNotFoundError(
                f"{repo} is not cached and the Hugging Face Hub cannot be reached: check the "
                "network (or a proxy, HF_ENDPOINT) and try again"
            ) from None
        raise ModelNotFoundError(
            f"{repo} is not cached and the Hugging Face Hub cannot be reached; "
            f"run {how} once online"
        ) from None
    except GatedRepoError:
        raise ModelNotFoundError(
            f"{repo} is gated: accept its terms on huggingface.co and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"{repo}: no such repository on the Hugging Face Hub (private? set HF_TOKEN)"
        ) from None
    except EntryNotFoundError as e:
        raise ModelNotFoundError(f"{repo}: file not found on the Hub ({e})") from None
    except (HfHubHTTPError, OSError) as e:
        raise ModelNotFoundError(f"{repo}: download failed ({e})") from None


# registry drafters that ship inside the package (src/specgen/assets/drafters)
PACKAGED = "specgen:"


def packaged_drafter(spec: str) -> Path:
    """The directory of a drafter shipped with specgen (`specgen:NAME`)."""
    from importlib.resources import files

    path = Path(str(files("specgen") / "assets" / "drafters" / spec.removeprefix(PACKAGED)))
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise ModelNotFoundError(
            f"{spec}: this drafter should ship with specgen but is missing from {path} "
            "(reinstall specgen)"
        )
    return path


def packaged_drafters(alias: str) -> list[str]:
    """The drafters shipped with specgen for model `alias` (`specgen:ALIAS-...`), whether
    or not its registry entry pairs them."""
    from importlib.resources import files

    root = Path(str(files("specgen") / "assets" / "drafters"))
    if not root.is_dir():
        return []
    return sorted(
        PACKAGED + p.name
        for p in root.iterdir()
        if p.name.startswith(alias.lower() + "-") and (p / "config.json").is_file()
    )


def resolve_drafter(spec: str) -> Path:
    """A drafter checkpoint: shipped (`specgen:NAME`), a local directory with config.json,
    a local .safetensors file (a head kept apart, e.g. MTP layers), or a Hub repo id."""
    if spec.startswith(PACKAGED):
        return packaged_drafter(spec)
    path = Path(spec).expanduser()
    if path.exists():
        if (path / "config.json").is_file():
            return path
        if path.is_file() and path.suffix == ".safetensors":  # a head alone (MTP layers)
            return path
        raise ModelNotFoundError(f"{spec}: not a drafter checkpoint (no config.json)")
    if _is_repo_id(spec):
        return download(spec)
    raise ModelNotFoundError(f"{spec}: no such drafter directory or Hub repo")
