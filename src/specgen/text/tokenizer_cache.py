"""The tokenizer transformers builds for a model, kept so that later runs need neither
transformers nor the build.

`AutoTokenizer.from_pretrained` costs a cold start 2.7 s (1.3 s importing transformers,
1.4 s building the tokenizer around `tokenizer.json`: special tokens added, the
post-processor rewritten, ...). What it builds is a `tokenizers.Tokenizer` (its backend)
plus the named special tokens and the chat template; encoding and decoding are the
backend's own calls. So the first load saves exactly that backend, as transformers left
it, with those few facts beside it, and later loads read them back with `tokenizers`
alone. Only a tokenizer whose encode, decode and chat-template calls are transformers'
generic ones (`TokenizersBackend`) is cached; any other keeps loading through
transformers. The cache is keyed by the model directory, its tokenizer files' sizes and
modification times, and the installed transformers, so a changed file or an upgrade
builds it again.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specgen.core.paths import specgen_home

FORMAT = 1
FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
         "added_tokens.json", "chat_template.jinja", "chat_template.json", "tokenizer.model",
         "vocab.json", "merges.txt")  # fmt: skip


def cache_dir(model_dir: Path) -> Path:
    model_dir = Path(model_dir).resolve()
    parts = [f"format={FORMAT}", str(model_dir), _library_stamp()]
    for name in FILES:
        path = model_dir / name
        if path.is_file():
            st = path.stat()
            parts.append(f"{name}|{st.st_size}|{st.st_mtime_ns}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return specgen_home() / "tokenizers" / f"{model_dir.name}-{digest}"


def _library_stamp() -> str:
    """Which transformers built the cache (its package file's size and time: an upgrade
    changes them), read without importing it."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return "transformers=none"
    st = os.stat(spec.origin)
    return f"transformers={st.st_size}|{st.st_mtime_ns}"


@dataclass(frozen=True)
class CachedTokenizer:
    """What a transformers fast tokenizer does for specgen, from the cache."""

    backend: Any  # tokenizers.Tokenizer
    special_tokens: dict[str, str]  # bos_token, eos_token, ...: what templates read
    chat_template: str | None
    eos_token_id: int | None

    def encode(self, text: str, *, special: bool) -> list[int]:
        return self.backend.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int], *, skip_special: bool) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special)


def load(model_dir: Path) -> CachedTokenizer | None:
    """The cached tokenizer of `model_dir`, or None (never cached, or not cacheable)."""
    where = cache_dir(model_dir)
    try:
        facts = json.loads((where / "codec.json").read_text(encoding="utf-8"))
        if facts.get("format") != FORMAT:
            return None
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(where / "tokenizer.json"))
    except Exception:  # missing, damaged or from another format: rebuilt
        return None
    # what transformers does on every call that pads and truncates nothing
    backend.no_truncation()
    backend.no_padding()
    backend.encode_special_tokens = bool(facts["split_special_tokens"])
    return CachedTokenizer(
        backend, dict(facts["special_tokens"]), facts["chat_template"], facts["eos_token_id"]
    )


def save(tokenizer: Any, model_dir: Path) -> Path | None:
    """Cache a transformers tokenizer of `model_dir` (written whole or not at all);
    None when it is not one whose calls the cache reproduces."""
    if not cacheable(tokenizer):
        return None
    try:
        template = tokenizer.get_chat_template()
    except (ValueError, TypeError):  # no template, or several and none the default
        template = None
    facts = {
        "format": FORMAT,
        "special_tokens": dict(tokenizer.special_tokens_map),
        "chat_template": template,
        "eos_token_id": tokenizer.eos_token_id,
        "split_special_tokens": bool(getattr(tokenizer, "split_special_tokens", False)),
    }
    where = cache_dir(model_dir)
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=where.parent))
    try:
        tokenizer.backend_tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "codec.json").write_text(json.dumps(facts), encoding="utf-8")
        try:
            tmp.rename(where)
        except OSError:  # there already: a damaged cache (replaced), or another process's
            shutil.rmtree(where, ignore_errors=True)
            try:
                tmp.rename(where)
            except OSError:  # another process wrote the same cache in between
                if not (where / "codec.json").is_file():
                    raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return where


def cacheable(tokenizer: Any) -> bool:
    """Whether `tokenizer`'s encode, decode and chat-template calls are transformers'
    generic fast ones, which only call its backend."""
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:
        return False
    if not isinstance(tokenizer, TokenizersBackend):
        return False
    cls = type(tokenizer)
    generic = {
        "_encode_plus": TokenizersBackend, "_decode": TokenizersBackend,
        "__call__": PreTrainedTokenizerBase, "encode": PreTrainedTokenizerBase,
        "decode": PreTrainedTokenizerBase, "apply_chat_template": PreTrainedTokenizerBase,
    }  # fmt: skip
    return all(getattr(cls, name) is getattr(base, name) for name, base in generic.items())
