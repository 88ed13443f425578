"""Logprobs in OpenAI's two shapes, and which of them go out with which text.

Values are the library's (`SamplingParams.logprobs`, `Pipeline.prompt_logprobs`): the
target's raw distribution at each position. Here they become
- chat: `{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}],
  "refusal": null}`, the `top_logprobs` likeliest tokens at each position;
- completions (legacy): `{tokens, token_logprobs, top_logprobs, text_offset}`, each
  position's `top_logprobs` a `{token: logprob}` object of the `logprobs` likeliest tokens
  and the chosen one (vLLM's; so `logprobs: 0` still names the chosen token's value), and
  with `echo` the prompt's tokens first, the very first with nulls (nothing precedes it).

A token's `token` is its text alone (tokenizer.decode of the one id, special tokens
written out); a token that is only part of a character's UTF-8 bytes is written
`bytes:\\xNN...` as OpenAI writes it, and `bytes` are its real bytes where the tokenizer
says them (byte-level BPE, SentencePiece's `<0xNN>`), else its text's UTF-8.

Stop strings cut text, not tokens: a token's logprobs are sent with the text its first
character is sent in, and a token whose text starts at or after a stop string is not sent.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specgen.core.events import TokenLogprob

if TYPE_CHECKING:
    from specgen.text.codec import TextCodec

MAX_COMPLETION_LOGPROBS = 5  # OpenAI's legacy completions limit
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@dataclass(frozen=True)
class Entry:
    """One position's logprobs as a response shows them."""

    token: str
    bytes: list[int]
    logprob: float | None  # None: the prompt's first token (echo)
    top: tuple[tuple[str, list[int], float], ...] | None  # (token, bytes, logprob)
    offset: int  # where the token's text starts in the choice's text


class TokenNames:
    """Each token id's text and bytes, read from the tokenizer once."""

    def __init__(self, codec: TextCodec) -> None:
        self.tokenizer = codec.tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._bytes_of = _byte_decoder(self.tokenizer)

    def __call__(self, token: int) -> tuple[str, list[int]]:
        named = self._cache.get(token)
        if named is None:
            named = self._cache[token] = self._name(token)
        return named

    def _name(self, token: int) -> tuple[str, list[int]]:
        text = self.tokenizer.decode(
            [token], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        piece = self.tokenizer.convert_ids_to_tokens(token)
        raw: bytes | None = None
        if isinstance(piece, str) and token not in self.tokenizer.all_special_ids:
            match = _BYTE_TOKEN.fullmatch(piece)
            if match:
                raw = bytes([int(match.group(1), 16)])
            elif self._bytes_of is not None and all(c in self._bytes_of for c in piece):
                raw = bytes(self._bytes_of[c] for c in piece)
        if raw is None:
            raw = text.encode("utf-8")
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: OpenAI's spelling
            text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
        return text, list(raw)

    def entry(self, logprob: TokenLogprob | None, token: int, offset: int) -> Entry:
        text, raw = self(token)
        if logprob is None:
            return Entry(text, raw, None, None, offset)
        top = tuple((*self(t), v) for t, v in logprob.top)
        return Entry(text, raw, logprob.logprob, top, offset)


def _byte_decoder(tokenizer: Any) -> dict[str, int] | None:
    """GPT-2's byte-level alphabet reversed (character -> byte), when the tokenizer's
    decoder is byte-level (GPT-2, Llama 3, Qwen, SmolLM2); else None."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None or "ByteLevel" not in repr(decoder):
        return None
    # GPT-2's bytes_to_unicode: printable bytes stand for themselves, the others for
    # 256, 257, ... in byte order
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    others = [b for b in range(256) if b not in printable]
    mapping = {chr(b): b for b in printable}
    mapping.update({chr(256 + n): b for n, b in enumerate(others)})
    return mapping


class Pending:
    """An answer's logprob entries waiting for their text to be sent (stop strings may
    hold text back, and cut it)."""

    def __init__(self, base: int = 0) -> None:
        self.base = base  # characters before the answer in the choice's text (echo)
        self.produced = 0  # answer characters the pipeline has produced
        self.sent = 0  # answer characters sent
        self._waiting: list[Entry] = []

    def add(self, names: TokenNames, chunk: Any) -> None:
        """A pipeline chunk's tokens (`Chunk.logprobs`, `Chunk.token_text`)."""
        pieces = chunk.token_text
        for i, logprob in enumerate(chunk.logprobs):  # the last may be the stop token's
            self._waiting.append(names.entry(logprob, logprob.token, self.base + self.produced))
            self.produced += len(pieces[i]) if i < len(pieces) else 0
        self.produced += len(chunk.text) - sum(len(p) for p in chunk.token_text)

    def release(self, chars: int) -> tuple[Entry, ...]:
        """The entries whose text starts within the next `chars` characters sent."""
        self.sent += chars
        end = self.base + self.sent
        n = next((i for i, e in enumerate(self._waiting) if e.offset >= end), len(self._waiting))
        out, self._waiting = tuple(self._waiting[:n]), self._waiting[n:]
        return out

    def rest(self) -> tuple[Entry, ...]:
        """The answer ended without a stop string: every entry left (tokens with no text)."""
        out, self._waiting = tuple(self._waiting), []
        return out


def echoed(
    names: TokenNames, codec: TextCodec, ids: Sequence[int], scored: Sequence[TokenLogprob] | None
):
    """The prompt's text (decoded token by token, as answers are) and, when `scored`
    (Pipeline.prompt_logprobs: ids[1:]), its entries."""
    from specgen.text.codec import Detokenizer

    detok = Detokenizer(codec)
    pieces = [detok.push([t]) for t in ids]
    if pieces:
        pieces[-1] += detok.flush()
    entries: list[Entry] = []
    if scored is not None:
        offset = 0
        for i, (token, piece) in enumerate(zip(ids, pieces, strict=True)):
            entries.append(names.entry(scored[i - 1] if i else None, token, offset))
            offset += len(piece)
    return "".join(pieces), tuple(entries)


def chat_logprobs(entries: Sequence[Entry]) -> dict[str, Any]:
    def one(token: str, raw: list[int], logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": logprob, "bytes": raw}

    content = [
        {**one(e.token, e.bytes, e.logprob or 0.0), "top_logprobs": [one(*t) for t in e.top or ()]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: Sequence[Entry]) -> dict[str, Any]:
    tops: list[dict[str, float] | None] = []
    for e in entries:
        if e.top is None:
            tops.append(None)
            continue
        top = {token: logprob for token, _, logprob in e.top}
        top.setdefault(e.token, e.logprob)  # type: ignore[arg-type]
        tops.append(top)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": tops,
        "text_offset": [e.offset for e in entries],
    }
