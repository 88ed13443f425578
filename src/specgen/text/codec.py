"""Text in and out: prompt formatting, stop tokens and streaming detokenization."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from specgen.core.errors import CheckpointError, PromptError
from specgen.core.once import built
from specgen.text import tokenizer_cache
from specgen.text.chat_template import render


class TextCodec:
    """The target's tokenizer, its chat template and its stop tokens.

    Prompts are formatted exactly as transformers'
    `apply_chat_template(messages, add_generation_prompt=True)` does, so token ids compare
    one to one with a transformers run of the same model.

    The first load builds transformers' tokenizer and caches what it built
    (text/tokenizer_cache.py); later loads encode, decode and render plain conversations
    from the cache, without transformers. `tokenizer` is transformers' own, loaded when
    something asks for more than that (the server's tool rendering, logprobs' token
    pieces, /tokenize).
    """

    def __init__(self, model_dir: Path, name: str, config_eos: tuple[int, ...] = ()) -> None:
        self.name = name
        self._dir = Path(model_dir)
        self._full: Any = None
        self._lock = threading.Lock()
        self._fast = tokenizer_cache.load(self._dir)
        if self._fast is None:  # the first load (or a tokenizer the cache cannot hold)
            start = time.perf_counter()
            self._full = self._load_full()
            where = tokenizer_cache.save(self._full, self._dir)
            if where is not None:
                built(f"{name}'s tokenizer", time.perf_counter() - start, where.parent)
                self._fast = tokenizer_cache.load(self._dir)
        eos = self._fast.eos_token_id if self._fast is not None else self._full.eos_token_id
        self.stop_ids = frozenset(config_eos) | _generation_eos(model_dir)
        if eos is not None:
            self.stop_ids |= {eos}

    @property
    def from_cache(self) -> bool:
        """Whether encoding and decoding run on the cached tokenizer (no transformers)."""
        return self._fast is not None

    @property
    def tokenizer(self) -> Any:
        """transformers' tokenizer of the model (loaded on first use)."""
        with self._lock:
            if self._full is None:
                self._full = self._load_full()
            return self._full

    def _load_full(self) -> Any:
        from transformers import AutoTokenizer

        try:
            return AutoTokenizer.from_pretrained(str(self._dir))
        except Exception as e:  # transformers raises many types for a broken tokenizer
            raise CheckpointError(f"{self.name}: cannot load the tokenizer ({e})") from None

    @property
    def has_chat_template(self) -> bool:
        if self._fast is not None:
            return bool(self._fast.chat_template)
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_chat(self, messages: list[dict[str, str]], *, think: bool = False) -> list[int]:
        """Token ids of a conversation, ending with the assistant's turn opened."""
        if not self.has_chat_template:
            raise CheckpointError(f"{self.name} has no chat template; use --raw")
        extra = {"enable_thinking": think}  # read by Qwen3's template, ignored by others
        fast = self._fast
        if fast is not None and _plain(messages):
            variables = {**fast.special_tokens, **extra}
            text = render(fast.chat_template, messages, add_generation_prompt=True, **variables)
            return fast.encode(text, special=False)
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, **extra
        )
        return list(out["input_ids"])

    def encode_prompt(self, prompt: str | list[dict[str, str]], *, raw: bool,
                      think: bool) -> list[int]:  # fmt: skip
        """A prompt's ids: a text or a conversation chat-templated, or a text as is (`raw`)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise PromptError("empty prompt")
            if raw:
                return self.encode_raw(prompt)
            prompt = [{"role": "user", "content": prompt}]
        return self.encode_chat(prompt, think=think)

    def encode_raw(self, text: str, *, special: bool = True) -> list[int]:
        """`text`'s ids (`special`: with what the tokenizer adds around it, e.g. a BOS)."""
        if self._fast is not None:
            return self._fast.encode(text, special=special)
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def vocab(self) -> dict[str, int]:
        """Every token (added ones too) -> its id."""
        if self._fast is not None:
            return self._fast.backend.get_vocab(with_added_tokens=True)
        return self.tokenizer.get_vocab()

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        if self._fast is not None:
            return self._fast.decode(ids, skip_special=skip_special)
        return self.tokenizer.decode(
            ids, skip_special_tokens=skip_special, clean_up_tokenization_spaces=False
        )


def _plain(messages: list[dict[str, Any]]) -> bool:
    """A conversation of role and text content only, which the cached path renders as
    transformers would; anything more (tool calls, reasoning fields, content parts, None
    values it would drop) goes through transformers itself."""
    return bool(messages) and all(
        isinstance(m, dict) and set(m) == {"role", "content"}
        and isinstance(m["role"], str) and isinstance(m["content"], str)
        for m in messages
    )  # fmt: skip


def _generation_eos(model_dir: Path) -> frozenset[int]:
    # generation_config.json is where chat models list their end-of-turn tokens (Qwen3:
    # <|im_end|> and <|endoftext|>; Llama 3: three ids); transformers' generate stops there.
    path = model_dir / "generation_config.json"
    if not path.is_file():
        return frozenset()
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return frozenset()
    if value is None:
        return frozenset()
    return frozenset(value if isinstance(value, list) else [value])


class Detokenizer:
    """Turns a growing list of token ids into text deltas.

    Byte-level tokenizers split one character over several tokens; decoding a token alone
    then yields U+FFFD. We decode a small window twice (up to the last emitted token, and
    up to now) and emit the difference only once it no longer ends in U+FFFD, so multi-byte
    characters are never split and leading spaces are never lost.
    """

    def __init__(self, codec: TextCodec) -> None:
        self.codec = codec
        self.ids: list[int] = []
        self._prefix = 0  # window start: tokens before it are fully emitted
        self._read = 0  # tokens before it have been emitted as text

    def push(self, ids: list[int]) -> str:
        self.ids.extend(ids)
        emitted = self.codec.decode(self.ids[self._prefix : self._read])
        text = self.codec.decode(self.ids[self._prefix :])
        if len(text) <= len(emitted) or text.endswith("\ufffd"):
            return ""
        self._prefix, self._read = self._read, len(self.ids)
        return text[len(emitted) :]

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the very end)."""
        emitted = self.codec.decode(self.ids[self._prefix : self._read])
        text = self.codec.decode(self.ids[self._prefix :])
        self._prefix = self._read = len(self.ids)
        return text[len(emitted) :]
