"""Text in and out: prompt formatting, stop tokens and streaming detokenization."""

from __future__ import annotations

import json
from pathlib import Path

from specgen.core.errors import CheckpointError


class TextCodec:
    """The target's tokenizer, its chat template and its stop tokens.

    Prompts are formatted exactly as transformers'
    `apply_chat_template(messages, add_generation_prompt=True)` does, so token ids compare
    one to one with a transformers run of the same model.
    """

    def __init__(self, model_dir: Path, name: str, config_eos: tuple[int, ...] = ()) -> None:
        from transformers import AutoTokenizer

        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        except Exception as e:  # transformers raises many types for a broken tokenizer
            raise CheckpointError(f"{name}: cannot load the tokenizer ({e})") from None
        self.name = name
        self.stop_ids = frozenset(config_eos) | _generation_eos(model_dir)
        if self.tokenizer.eos_token_id is not None:
            self.stop_ids |= {self.tokenizer.eos_token_id}

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def encode_chat(self, messages: list[dict[str, str]], *, think: bool = False) -> list[int]:
        """Token ids of a conversation, ending with the assistant's turn opened."""
        if not self.has_chat_template:
            raise CheckpointError(f"{self.name} has no chat template; use --raw")
        extra = {"enable_thinking": think}  # read by Qwen3's template, ignored by others
        out = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, **extra
        )
        return list(out["input_ids"])

    def encode_raw(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(
            ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )


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
