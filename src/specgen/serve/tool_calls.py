"""A model's tool calls read back out of its text, in the format its chat template taught
it: one `Format` per family (serve/tool_formats.py), found by what the template writes.

- `hermes` (Qwen3, Qwen2.5): `<tool_call>{"name": N, "arguments": {...}}</tool_call>`
- `qwen_xml` (Qwen3.5, Qwen3-Coder): `<tool_call><function=N><parameter=K>V</parameter>
  </function></tool_call>`, a newline after each tag; values are text, typed by the schema
- `llama_json` (Llama 3.1-3.3): the whole answer is `{"name": N, "parameters": {...}}`
  (after `<|python_tag|>`, a special token the text leaves out)
- `gemma4` (Gemma 4): `<|tool_call>call:N{k:<|"|>v<|"|>,n:1}<tool_call|>`
- `generic` (any template without tools: serve/generic_tools.py): the whole answer is
  `{"tool_calls": [{"name": N, "arguments": {...}}]}` or `{"response": TEXT}`

`ToolStream` reads an answer as it streams: text before a call goes out as content at
once (less a tail that may be the start of the opener), each call once it is closed.
Text that does not parse as a call is handed back as content, never dropped.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from specgen.serve.tool_formats import Format


@dataclass(frozen=True)
class Call:
    name: str
    arguments: str  # a JSON object, as OpenAI sends it
    id: str = ""
    index: int = 0  # among the answer's calls

    def body(self, index: int | None = None) -> dict[str, Any]:
        fn = {"name": self.name, "arguments": self.arguments}
        out: dict[str, Any] = {"id": self.id, "type": "function", "function": fn}
        if index is not None:
            out = {"index": index, **out}
        return out


def new_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


# --- reading a whole answer, or one as it streams -------------------------------------------


@dataclass(frozen=True)
class Content:
    text: str


class ToolStream:
    """An answer's text in, `Content` and `Call` out, in order. `primed` is text the
    answer was made to start with (the prompt ends with it, so the model never writes
    it); `single` keeps only the first call (`parallel_tool_calls: false`)."""

    def __init__(
        self, fmt: Format, schemas: dict[str, dict], primed: str = "", single: bool = False
    ) -> None:
        self.fmt, self.schemas, self.single = fmt, schemas, single
        self.calls = 0
        self._buf = primed
        self._in_call = False
        self._started = False  # anything but whitespace seen (formats that open at the start)
        self._done = False  # at_start_only: the answer is content, not a call
        self._after_call = False  # whitespace right after a call is not content

    def push(self, text: str) -> list[Content | Call]:
        self._buf += text
        return self._drain(final=False)

    def flush(self) -> list[Content | Call]:
        return self._drain(final=True)

    def _drain(self, final: bool) -> list[Content | Call]:
        out: list[Content | Call] = []
        while True:
            if self._in_call:
                if not self._read_call(out, final):
                    return out
                continue
            if self._done:
                out += _content(self._buf)
                self._buf = ""
                return out
            if self.fmt.at_start_only:
                stripped = self._buf.lstrip().removeprefix("<|python_tag|>").lstrip()
                if not stripped:
                    if final:
                        out += _content(self._buf)
                        self._buf = ""
                    return out
                if stripped.startswith("{"):
                    self._in_call = True
                    continue
                self._done = True
                continue
            if self._after_call:
                if not self._buf.strip():
                    if final:
                        self._buf = ""
                    return out
                self._buf, self._after_call = self._buf.lstrip(), False
            at = self._buf.find(self.fmt.opener)
            if at < 0:
                keep = 0 if final else _partial_tail(self._buf, self.fmt.opener)
                out += _content(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                return out
            out += _content(self._buf[:at])
            self._buf = self._buf[at:]
            self._in_call = True

    def _read_call(self, out: list, final: bool) -> bool:
        """One call from the buffer (which starts at its opener); False: wait for more."""
        closer = self.fmt.closer
        if closer is None:  # the rest of the answer is the call(s)
            if not final:
                return False
            raw, self._buf = self._buf, ""
        else:
            end = self._buf.find(closer)
            if end < 0:
                if not final:
                    return False
                raw, self._buf = self._buf, ""  # cut short (max_tokens): what it was
            else:
                raw = self._buf[: end + len(closer)]
                self._buf = self._buf[end + len(closer) :]
        self._in_call = False
        closed = closer is None or raw.endswith(closer)
        inner = raw if closer is None else raw[len(self.fmt.opener) :].removesuffix(closer)
        parsed = self.fmt.parse(inner, self.schemas) if closed else None
        if parsed is None:
            said = self.fmt.reply(inner) if closed else None
            out += _content(raw if said is None else said)
            if closer is None:
                self._done = True
            return True
        self._after_call = True
        for name, args in parsed:
            if self.single and self.calls:
                break
            out.append(Call(name, json.dumps(args, ensure_ascii=False), new_id(), self.calls))
            self.calls += 1
        if closer is None:
            self._done = True
        return True


def split(text: str, fmt: Format, schemas: dict[str, dict], primed: str = "",
          single: bool = False) -> tuple[str, list[Call]]:  # fmt: skip
    """A whole answer: its content and its calls."""
    stream = ToolStream(fmt, schemas, primed, single)
    events = stream.push(text) + stream.flush()
    content = "".join(e.text for e in events if isinstance(e, Content))
    return content, [e for e in events if isinstance(e, Call)]


def _content(text: str) -> list[Content]:
    return [Content(text)] if text else []


def _partial_tail(buf: str, opener: str) -> int:
    """The length of the longest tail of `buf` that is a proper prefix of `opener`."""
    for k in range(min(len(opener) - 1, len(buf)), 0, -1):
        if buf.endswith(opener[:k]):
            return k
    return 0
