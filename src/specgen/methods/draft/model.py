"""A draft model: any causal LM specgen loads as a target, loaded beside the target the
same way (a GGUF file packed as stored, safetensors at the target's dtype), and checked
to share its tokenizer.

Sharing a tokenizer is judged by vocabulary, not by size: every token string must map to
the same id in both (added and special tokens included), since a draft token is handed to
the target as an id. Two models whose embeddings merely have the same number of rows
(vLLM and SGLang check only that) can still number their tokens differently."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.core.errors import CheckpointError, SpecgenError
from specgen.drafting.base import Checkpoint
from specgen.hub import ResolvedModel, resolve_model
from specgen.models.cache.kv import StaticKVCache
from specgen.models.loading import load_gguf_target, load_target
from specgen.models.transformer import Transformer
from specgen.registry import MODELS
from specgen.text.codec import TextCodec


@dataclass(frozen=True)
class DraftModel:
    model: Transformer
    name: str  # as given (alias, path), for messages
    source: str  # the file or directory its weights came from (part of the cost key)


def is_model_source(source: str) -> bool:
    """Whether a --drafter value names a whole model rather than a drafter checkpoint: a
    model alias, a GGUF file, or a directory holding one GGUF file and no config.json."""
    if source.lower() in MODELS:
        return True
    path = Path(source).expanduser()
    if path.is_file():
        return path.suffix == ".gguf"
    return path.is_dir() and not (path / "config.json").is_file() and any(path.glob("*.gguf"))


def locate_model(source: str, notify: Callable[[str], None] | None = None) -> Path:
    """The directory holding a draft model's config.json and tokenizer (for a GGUF file,
    the one converted from its header)."""
    return resolve_model(source, notify=notify).path


def _resolved(checkpoint: Checkpoint, notify: Callable[[str], None] | None) -> ResolvedModel:
    """The model `checkpoint` names: by its name as given where that finds it (an alias or
    a GGUF file, whose weights `path` does not hold), else by its directory."""
    path = checkpoint.path
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return ResolvedModel(path, checkpoint.name, "local")
    return resolve_model(checkpoint.name, notify=notify)


def load_draft_model(
    checkpoint: Checkpoint,
    target: Transformer,
    target_name: str,
    notify: Callable[[str], None] | None = None,
) -> DraftModel:
    """The draft model on the target's device and dtype, its tokenizer checked against
    the target's."""
    resolved = _resolved(checkpoint, notify)
    name = checkpoint.name
    if notify:
        notify(f"loading draft model {checkpoint.short_name}")
    dtype, device = target.dtype, str(target.device)
    if resolved.gguf is not None:
        model = load_gguf_target(resolved.gguf, resolved.path, dtype=dtype, device=device,
                                 name=name)  # fmt: skip
    else:
        model = load_target(resolved.path, dtype=dtype, device=device, name=name)
    if type(model.new_cache(1)) is not StaticKVCache:
        raise CheckpointError(
            f"{name}: a model with recurrent layers cannot draft yet (its state rolls back "
            "only into its last forward, and a drafter rolls back over a whole chain)"
        )
    check_vocabulary(TextCodec(resolved.path, name).vocab(), _target_vocab(target_name),
                     name, target_name)  # fmt: skip
    return DraftModel(model, name, str(resolved.gguf or resolved.path))


def _target_vocab(target_name: str) -> dict[str, int]:
    try:
        resolved = resolve_model(target_name)
    except SpecgenError as e:
        raise CheckpointError(
            f"cannot read {target_name}'s tokenizer to pair a draft model ({e})"
        ) from None
    return TextCodec(resolved.path, target_name).vocab()


def check_vocabulary(
    draft: dict[str, int], target: dict[str, int], draft_name: str, target_name: str
) -> None:
    """One line naming both models when any token maps to another id (or is missing)."""
    if draft == target:
        return
    differing = sorted(
        (t for t in draft.keys() | target.keys() if draft.get(t) != target.get(t)),
        key=lambda t: min(draft.get(t, 1 << 62), target.get(t, 1 << 62)),
    )
    token = differing[0]
    raise CheckpointError(
        f"{draft_name} cannot draft for {target_name}: their tokenizers differ "
        f"({len(differing)} tokens map to other ids, e.g. {token!r}: "
        f"{draft.get(token, 'absent')} there, {target.get(token, 'absent')} in the target)"
    )


def fit_vocabulary(logits: torch.Tensor, vocab: int) -> torch.Tensor:  # [1, Vd] -> [1, V]
    """The draft model's logits over the target's ids: rows past the target's vocabulary
    (padding) dropped, ids past the draft model's (the target's padding) never drafted."""
    v = logits.shape[-1]
    if v == vocab:
        return logits
    if v > vocab:
        return logits[..., :vocab]
    pad = logits.new_full((*logits.shape[:-1], vocab - v), float("-inf"))
    return torch.cat([logits, pad], dim=-1)
