"""How each family writes a tool call, read back out of its text (serve/tool_calls.py
streams answers through these): one `Format` per family, found by what its chat template
writes, and the value syntaxes they use (JSON objects, schema-typed text, Gemma 4's
`k:<|"|>v<|"|>` pairs).
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from typing import Any


class Format(ABC):
    """How one family writes a call. `opener`/`closer` bound each call; a format with no
    closer (`llama_json`) takes the rest of the answer, and only from its start."""

    name = ""
    opener = ""
    closer: str | None = None
    at_start_only = False
    keeps_special = False  # its markers are special tokens: decode the answer with them

    @abstractmethod
    def detect(self, template: str) -> bool: ...

    @abstractmethod
    def prefix(self, name: str | None) -> str:
        """What the answer is made to start with when a call is required (`name` None)
        or a named one is; the model writes the rest."""
        ...

    @abstractmethod
    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        """The calls in the text between opener and closer; None if it is not calls."""
        ...

    def reply(self, inner: str) -> str | None:
        """The content a text that is not calls stands for (None: the text itself)."""
        return None


class Hermes(Format):
    name, opener, closer = "hermes", "<tool_call>", "</tool_call>"

    def detect(self, template: str) -> bool:
        return "<tool_call>" in template and "<function=" not in template

    def prefix(self, name: str | None) -> str:
        named = "" if name is None else f'{{"name": {json.dumps(name)}, "arguments": '
        return "<tool_call>\n" + named

    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        obj = _json_object(inner)
        if obj is None or not isinstance(obj.get("name"), str):
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # some fine-tunes quote the object
            args = _json_object(args)
        return [(obj["name"], args)] if isinstance(args, dict) else None


class QwenXML(Format):
    name, opener, closer = "qwen_xml", "<tool_call>", "</tool_call>"
    _function = re.compile(r"<function=([^>\n]+)>(.*?)(?:</function>|$)", re.DOTALL)
    _parameter = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

    def detect(self, template: str) -> bool:
        return "<tool_call>" in template and "<function=" in template

    def prefix(self, name: str | None) -> str:
        return "<tool_call>\n<function=" + ("" if name is None else f"{name}>\n")

    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        found = self._function.search(inner)
        if found is None:
            return None
        name = found.group(1).strip()
        props = (schemas.get(name) or {}).get("properties") or {}
        args = {
            key.strip(): _typed(value, (props.get(key.strip()) or {}).get("type"))
            for key, value in self._parameter.findall(found.group(2))
        }
        return [(name, args)]


class LlamaJSON(Format):
    name, opener, closer, at_start_only = "llama_json", "{", None, True

    def detect(self, template: str) -> bool:
        return '"parameters": dictionary of argument name' in template or (
            "<|python_tag|>" in template and "tool" in template
        )

    def prefix(self, name: str | None) -> str:
        return '{"name": ' + ("" if name is None else f'{json.dumps(name)}, "parameters": ')

    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        calls = []
        for part in _json_objects(inner.removeprefix("<|python_tag|>")):
            args = part.get("parameters", part.get("arguments", {}))
            if not isinstance(part.get("name"), str) or not isinstance(args, dict):
                return None
            calls.append((part["name"], args))
        return calls or None


class Gemma4(Format):
    name, opener, closer, keeps_special = "gemma4", "<|tool_call>", "<tool_call|>", True

    def detect(self, template: str) -> bool:
        return "<|tool_call>" in template

    def prefix(self, name: str | None) -> str:
        return "<|tool_call>call:" + ("" if name is None else f"{name}{{")

    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        text = inner.strip()
        if not text.startswith("call:") or "{" not in text:
            return None
        name, _, rest = text[len("call:") :].partition("{")
        try:
            args, end = _GemmaReader(rest).object_body()
        except ValueError:
            return None
        return [(name.strip(), args)] if rest[end:].strip() == "" else None


class GenericJSON(Format):
    """Chosen, never detected: the format specgen teaches a template without tools."""

    name, opener, closer, at_start_only = "generic", "{", None, True

    def detect(self, template: str) -> bool:
        return False

    def prefix(self, name: str | None) -> str:
        return ""  # the grammar forces the call's shape instead

    def parse(self, inner: str, schemas: dict[str, dict]) -> list[tuple[str, dict]] | None:
        obj = _json_object(inner)
        calls = obj.get("tool_calls") if obj is not None else None
        if not isinstance(calls, list) or not calls:
            return None
        out = []
        for call in calls:
            name = call.get("name") if isinstance(call, dict) else None
            args = call.get("arguments", {}) if isinstance(call, dict) else None
            if not isinstance(name, str) or not isinstance(args, dict):
                return None
            out.append((name, args))
        return out

    def reply(self, inner: str) -> str | None:
        obj = _json_object(inner)
        text = obj.get("response") if obj is not None else None
        return text if isinstance(text, str) else None


FORMATS: tuple[Format, ...] = (QwenXML(), Hermes(), Gemma4(), LlamaJSON())
GENERIC = GenericJSON()


def format_of(template: str) -> Format | None:
    return next((f for f in FORMATS if f.detect(template)), None)


# --- the formats' value syntaxes -------------------------------------------------------------


def _json_object(text: str) -> dict | None:
    try:
        value = json.loads(text.strip())
    except (json.JSONDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _json_objects(text: str) -> list[dict]:
    """Objects one after another, separated by `;`, commas or whitespace (Llama writes
    parallel calls either way); [] if anything else is there."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;,":
            i += 1
        if i == len(text):
            return out
        try:
            value, i = decoder.raw_decode(text, i)
        except (json.JSONDecodeError, RecursionError):
            return []
        if not isinstance(value, dict):
            return []
        out.append(value)


def _typed(value: str, kind: Any) -> Any:
    """A `<parameter>` value as its JSON Schema type says (the XML carries only text)."""
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind in (None, "string"):
        return value
    if kind == "boolean" and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    try:
        parsed = json.loads(value)
    except (json.JSONDecodeError, RecursionError):
        return value
    ok = {"integer": int, "number": int | float, "object": dict, "array": list}.get(kind)
    fits = ok is None or (isinstance(parsed, ok) and not isinstance(parsed, bool))
    return parsed if fits else value


class _GemmaReader:
    """Gemma 4's argument syntax: `{k:v,...}` with bare keys, strings between `<|"|>`
    marks, bare numbers, true/false/null, nested `{...}` and `[...]`."""

    QUOTE = '<|"|>'
    MAX_DEPTH = 64

    def __init__(self, text: str) -> None:
        self.text, self.i, self.depth = text, 0, 0

    def object_body(self) -> tuple[dict, int]:
        """Read `k:v,...}` (the opening brace already read); the index after the `}`."""
        out: dict = {}
        self._enter()
        while True:
            self._space()
            if self._take("}"):
                break
            key_end = self.text.find(":", self.i)
            if key_end < 0:
                raise ValueError("no ':' after a key")
            key = self.text[self.i : key_end].strip()
            key = key.removeprefix(self.QUOTE).removesuffix(self.QUOTE)
            self.i = key_end + 1
            out[key] = self.value()
            self._space()
            if not self._take(","):
                if not self._take("}"):
                    raise ValueError("expected ',' or '}'")
                break
        self.depth -= 1
        return out, self.i

    def value(self) -> Any:
        self._space()
        if self.text.startswith(self.QUOTE, self.i):
            end = self.text.find(self.QUOTE, self.i + len(self.QUOTE))
            if end < 0:
                raise ValueError("an unclosed string")
            s = self.text[self.i + len(self.QUOTE) : end]
            self.i = end + len(self.QUOTE)
            return s
        if self._take("{"):
            return self.object_body()[0]
        if self._take("["):
            items: list = []
            self._enter()
            while True:
                self._space()
                if self._take("]"):
                    break
                items.append(self.value())
                self._space()
                if not self._take(","):
                    if not self._take("]"):
                        raise ValueError("expected ',' or ']'")
                    break
            self.depth -= 1
            return items
        m = re.compile(r"[^,}\]]*").match(self.text, self.i)
        raw = m.group(0).strip() if m else ""
        self.i = m.end() if m else self.i
        if not raw:
            raise ValueError("an empty value")
        if raw in ("true", "false"):
            return raw == "true"
        if raw in ("null", "none", "None"):
            return None
        try:
            return json.loads(raw)  # numbers
        except (json.JSONDecodeError, RecursionError):
            return raw

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > self.MAX_DEPTH:
            raise ValueError("nested too deeply")

    def _space(self) -> None:
        while self.i < len(self.text) and self.text[self.i] in " \t\r\n":
            self.i += 1

    def _take(self, char: str) -> bool:
        if self.text.startswith(char, self.i):
            self.i += len(char)
            return True
        return False
