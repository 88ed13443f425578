"""Which models at hand can draft for which (`specgen models`): a pair shares the
vocabulary (every token at the same id, as `--draft-model` checks), the draft model is
smaller (by its weight count from the config), and its cache rolls back anywhere (no
recurrent layers). Nothing is loaded but configs and tokenizers."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from specgen.core.config import ModelArgs
from specgen.core.errors import SpecgenError
from specgen.models.cache.kv import StaticKVCache
from specgen.models.families import model_args
from specgen.models.family import family_of
from specgen.models.loading import read_config
from specgen.text.codec import TextCodec


@dataclass(frozen=True)
class _Model:
    name: str
    weights: int  # about how many
    vocab: dict[str, int]
    can_draft: bool


def weight_count(args: ModelArgs) -> int:
    """About how many weights a model has: its layers' attention and MLP matrices, its
    embedding and (untied) head. Enough to tell the smaller of two models apart."""
    h = args.hidden_size
    attention = h * args.head_dim * 2 * (args.num_heads + args.num_kv_heads)
    mlp = 3 * h * args.intermediate_size
    head = args.vocab_size * h * (1 if args.tie_word_embeddings else 2)
    return args.num_layers * (attention + mlp) + head


def _read(name: str, path: Path) -> _Model | None:
    """A model's facts for pairing, or None where specgen cannot run it."""
    try:
        args = model_args(read_config(path, name), name=name)
        vocab = TextCodec(path, name).vocab()
        cache = family_of(args).new_cache(
            args, batch=1, capacity=1, steps=1, dtype=torch.float32, device="cpu"
        )
    except (SpecgenError, OSError, ValueError, KeyError, TypeError):
        return None
    return _Model(name, weight_count(args), vocab, type(cache) is StaticKVCache)


def pairings(models: Mapping[str, Path]) -> dict[str, list[str]]:
    """For each model (name -> its directory of config and tokenizer), the others that can
    draft for it, smallest first."""
    read = [m for m in (_read(n, p) for n, p in models.items()) if m is not None]
    out: dict[str, list[str]] = {}
    for target in read:
        fits = (d for d in read if d.can_draft and d.weights < target.weights)
        drafts = sorted((d for d in fits if d.vocab == target.vocab), key=lambda d: d.weights)
        if drafts:
            out[target.name] = [d.name for d in drafts]
    return out
