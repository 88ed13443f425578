"""What an OpenAI-compatible server's streamed answer says: its text, its token count and,
where the server reports them, its speculative statistics (bench/endpoint.py sends the
requests).

Statistics are read by name wherever they sit in a chunk (`served_stats`):
- specgen's extension `"specgen": {"mean_acceptance_length", "num_spec_steps",
  "num_accepted_draft_tokens", "num_draft_tokens", "acceptance_histogram", ...}` and vLLM's
  `"metrics": {"speculative_decoding": {...}}` (`--per-request-spec-decode-metrics`), which
  share those names: τ as reported;
- SGLang's `spec_accept_length` / `spec_verify_ct` (`meta_info`): τ as reported;
- llama-server's `"timings": {"predicted_n", "draft_n", "draft_n_accepted"}`: no step count,
  but every step commits its accepted drafts plus one token of the target's own, so
  steps = predicted_n − draft_n_accepted and τ = predicted_n / steps (derived). Without
  `draft_n` nothing says whether it drafted: τ unknown.

The stream is parsed here (server-sent events, robust to lines split anywhere across
reads, CRLF or CR line ends, comments and multi-line data).
"""

from __future__ import annotations

import codecs
import json
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from specgen.core.errors import SpecgenError

_LINE_END = re.compile(r"\r\n|\r|\n")


class SSEDecoder:
    """Server-sent events from a byte stream: feed bytes as they arrive, get the data of
    each complete event (its `data:` lines joined by newlines)."""

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._rest = ""  # an incomplete line
        self._data: list[str] = []  # the current event's data lines
        self._after_cr = False  # the last read ended in \r: a \n opening the next is its pair

    def feed(self, chunk: bytes) -> list[str]:
        text = self._utf8.decode(chunk)
        if self._after_cr and text.startswith("\n"):
            text = text[1:]
        if text:
            self._after_cr = text.endswith("\r")
        lines = _LINE_END.split(self._rest + text)
        self._rest = lines.pop()
        return [event for line in lines if (event := self._line(line)) is not None]

    def close(self) -> list[str]:
        """The end of the stream: a last line or event without its blank line counts."""
        text = self._rest + self._utf8.decode(b"", final=True)
        self._rest = ""
        events = [] if not text else [e for e in (self._line(text),) if e is not None]
        if self._data:
            events.append("\n".join(self._data))
            self._data = []
        return events

    def _line(self, line: str) -> str | None:
        if not line:  # a blank line ends the event
            data, self._data = self._data, []
            return "\n".join(data) if data else None
        if line.startswith(":"):  # a comment (keep-alive)
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None  # event:, id:, retry: change nothing here


@dataclass(frozen=True)
class ServedStats:
    """What a server said about one answer's speculation; None where it did not say."""

    tau: float | None  # tokens per step incl. the bonus (τ)
    source: str | None  # "reported" (the server's own τ) or "derived" (from its counts)
    steps: int | None = None
    accepted: int | None = None  # accepted draft tokens
    drafted: int | None = None  # draft tokens sent to verification
    histogram: tuple[int, ...] | None = None  # steps by accepted drafts (index = accepted)
    kind: str = ""  # whose format: specgen/vllm names, sglang, llama.cpp


SPEC_NAMES = ("mean_acceptance_length", "num_spec_steps", "num_accepted_draft_tokens")
SGLANG_NAMES = ("spec_accept_length", "spec_verify_ct")


def served_stats(chunk: dict[str, Any]) -> ServedStats | None:
    """The speculative statistics in one chunk (or whole response), in any known format."""
    found = _find(chunk, SPEC_NAMES)
    if found is not None:
        return _from_spec_names(found)
    found = _find(chunk, SGLANG_NAMES)
    if found is not None:
        tau, steps = _number(found.get("spec_accept_length")), _int(found.get("spec_verify_ct"))
        accepted = round((tau - 1) * steps) if tau is not None and steps is not None else None
        hist = _histogram(found.get("spec_accept_histogram"))
        return ServedStats(tau, "reported" if tau else None, steps, accepted, None, hist, "sglang")
    timings = chunk.get("timings")
    if isinstance(timings, dict) and _int(timings.get("predicted_n")) is not None:
        return _from_llama_timings(timings)
    return None


def _find(obj: Any, names: tuple[str, ...], depth: int = 3) -> dict[str, Any] | None:
    """The first object, breadth first down to `depth`, holding one of `names` (a list is
    looked into by its first item: `choices[0]`)."""
    level = [obj]
    for _ in range(depth + 1):
        below = []
        for item in level:
            if isinstance(item, list) and item:
                item = item[0]
            if not isinstance(item, dict):
                continue
            if any(name in item for name in names):
                return item
            below += [v for v in item.values() if isinstance(v, dict | list)]
        level = below
    return None


def _from_spec_names(d: dict[str, Any]) -> ServedStats:
    tau = _number(d.get("mean_acceptance_length"))
    steps = _int(d.get("num_spec_steps"))
    accepted = _int(d.get("num_accepted_draft_tokens"))
    hist = _histogram(d.get("acceptance_histogram"))
    if steps is None and hist is not None:
        steps = sum(hist)
    if accepted is None and hist is not None:
        accepted = sum(j * n for j, n in enumerate(hist))
    source = "reported" if tau is not None else None
    if tau is None and steps and accepted is not None:
        tau, source = 1 + accepted / steps, "derived"
    kind = "specgen" if "verify_policy" in d or "mean_verify_length" in d else "vllm"
    return ServedStats(tau, source, steps, accepted, _int(d.get("num_draft_tokens")), hist, kind)


def _from_llama_timings(t: dict[str, Any]) -> ServedStats:
    tokens = _int(t.get("predicted_n")) or 0
    drafted, accepted = _int(t.get("draft_n")), _int(t.get("draft_n_accepted"))
    if drafted is None:  # nothing says whether it drafted at all
        return ServedStats(None, None, kind="llama.cpp")
    accepted = accepted or 0
    steps = tokens - accepted  # each step: its accepted drafts + one token of the target's
    if steps <= 0:
        return ServedStats(None, None, None, accepted, drafted, kind="llama.cpp")
    return ServedStats(tokens / steps, "derived", steps, accepted, drafted, None, "llama.cpp")


def _number(value: Any) -> float | None:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    return float(value) if ok else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _histogram(value: Any) -> tuple[int, ...] | None:
    """A dense list (index = accepted drafts), or a sparse {"j": steps} object."""
    if isinstance(value, list) and value and all(_int(v) is not None for v in value):
        return tuple(value)
    if isinstance(value, dict) and value:
        try:
            sparse = {int(k): int(v) for k, v in value.items()}
        except (TypeError, ValueError):
            return None
        if min(sparse) < 0:
            return None
        return tuple(sparse.get(j, 0) for j in range(max(sparse) + 1))
    return None


@dataclass
class Answer:
    """One streamed answer as the client saw it."""

    text: str = ""
    token_ids: list[int] | None = None  # where the server sends them (vLLM return_token_ids)
    tokens: int = 0  # completion tokens
    tokens_from: str = "usage"  # usage, timings (llama-server), or chunks (a guess)
    seconds: float = 0.0  # from sending the request to the end of the stream
    ttft_seconds: float | None = None  # to the first chunk with content
    finish_reason: str | None = None
    stats: ServedStats | None = None
    usage: dict[str, Any] | None = field(default=None, repr=False)


def collect(
    chunks: Iterable[bytes],
    *,
    start: float,
    where: str,
    clock: Callable[[], float] = time.perf_counter,
) -> Answer:
    """Read a streamed chat (or completions) answer from its raw bytes; `start` is when the
    request was sent, by `clock`. Anything that is not an OpenAI stream is an error naming
    `where`."""
    decoder = SSEDecoder()
    reader = _Reader(where)
    for chunk in chunks:
        now = clock()
        for data in decoder.feed(chunk):
            reader.take(data, now - start)
        if reader.done:
            break
    else:
        for data in decoder.close():
            reader.take(data, clock() - start)
    return reader.answer(clock() - start)


class _Reader:
    def __init__(self, where: str) -> None:
        self.where = where
        self.done = False
        self.openai = False  # a chunk with `choices` came
        self.pieces: list[str] = []
        self.chunks_with_content = 0
        self.ids: list[int] | None = None
        self.first: float | None = None
        self.end: float | None = None
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.stats: ServedStats | None = None
        self.timings_tokens: int | None = None

    def take(self, data: str, now: float) -> None:
        if self.done:
            return
        if data.strip() == "[DONE]":
            self.done, self.end = True, now
            return
        try:
            obj = json.loads(data)
        except ValueError:
            raise SpecgenError(
                f"{self.where}: not an OpenAI stream (an event is not JSON: {short_text(data)})"
            ) from None
        if not isinstance(obj, dict):
            raise SpecgenError(
                f"{self.where}: not an OpenAI stream (an event is {short_text(data)})"
            )
        if "error" in obj:
            raise SpecgenError(f"{self.where}: the server failed mid-answer: {error_text(obj)}")
        choices = obj.get("choices")
        if isinstance(choices, list):
            self.openai = True
            if choices and isinstance(choices[0], dict):
                self._choice(choices[0], now)
        if isinstance(obj.get("usage"), dict):
            self.usage = obj["usage"]
        stats = served_stats(obj)
        if stats is not None:
            self.stats = stats
        timings = obj.get("timings")
        if isinstance(timings, dict) and _int(timings.get("predicted_n")) is not None:
            self.timings_tokens = timings["predicted_n"]
        self.end = now

    def _choice(self, choice: dict[str, Any], now: float) -> None:
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        piece = delta.get("content") if "delta" in choice else choice.get("text")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(piece, str) and piece or isinstance(reasoning, str) and reasoning:
            if self.first is None:
                self.first = now
            self.chunks_with_content += 1
        if isinstance(piece, str):
            self.pieces.append(piece)
        ids = choice.get("token_ids", delta.get("token_ids"))
        if isinstance(ids, list) and all(_int(t) is not None for t in ids):
            self.ids = (self.ids or []) + ids
        if isinstance(choice.get("finish_reason"), str):
            self.finish = choice["finish_reason"]

    def answer(self, now: float) -> Answer:
        if not self.openai:
            raise SpecgenError(f"{self.where}: not an OpenAI chat stream (no chunk had `choices`)")
        if not self.done and self.finish is None:
            raise SpecgenError(f"{self.where}: the stream ended before the answer did")
        tokens, source = _int((self.usage or {}).get("completion_tokens")), "usage"
        if tokens is None and self.timings_tokens is not None:
            tokens, source = self.timings_tokens, "timings"
        if tokens is None:
            tokens, source = self.chunks_with_content, "chunks"
        return Answer(
            text="".join(self.pieces),
            token_ids=self.ids,
            tokens=tokens,
            tokens_from=source,
            seconds=self.end if self.end is not None else now,
            ttft_seconds=self.first,
            finish_reason=self.finish,
            stats=self.stats,
            usage=self.usage,
        )


def short_text(text: str, limit: int = 60) -> str:
    text = " ".join(str(text).split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def error_text(obj: Any) -> str:
    """The message of an error body: OpenAI's {"error": {"message"}}, FastAPI's
    {"detail"}, or the start of whatever it is."""
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return " ".join(error["message"].split())
        for key in ("error", "detail", "message"):
            if isinstance(obj.get(key), str):
                return " ".join(obj[key].split())
    return short_text(json.dumps(obj) if not isinstance(obj, str) else obj, 120)


# --- the client ----------------------------------------------------------------------------
