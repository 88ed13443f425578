"""OpenAI's request fields in, `GenRequest` out; and the response bodies back.

Fields specgen implements are checked for type and range (a 400 naming the field).
Harmless fields it does not implement (`user`, `logit_bias: {}`, `n: 1`, ...) are
accepted and ignored, as are unknown ones (clients send many); a field it cannot honour
with the value given (`n: 2`, `logit_bias` with entries, ...) is a 400 naming it, rather
than an answer that silently ignores what was asked. Logprobs (chat `logprobs` +
`top_logprobs` up to 20; completions `logprobs` up to 5, `echo`) and penalties are the
library's (`SamplingParams`); the shapes they come back in: serve/logprobs.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgen.core.config import DEFAULT_MAX_NEW_TOKENS, SamplingParams, checked_max_new_tokens
from specgen.core.errors import OptionError
from specgen.serve.errors import invalid
from specgen.serve.logprobs import MAX_COMPLETION_LOGPROBS
from specgen.serve.tools import TOOL_FIELDS, Tools, parse_tools, tool_calls_of

Messages = list[dict[str, Any]]
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant",
         "tool": "tool"}  # fmt: skip
MAX_STOPS = 16
API_NAMES = {"max_new_tokens": "max_tokens"}  # the library's option -> the request's field

# field -> the values that change nothing (anything else cannot be honoured: a 400)
HARMLESS: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ["text"]),
    "audio": (None,),
    "min_tokens": (None, 0),
    "ignore_eos": (None, False),
}
COMPLETION_HARMLESS = {"best_of": (None, 1), "suffix": (None, "")}
PENALTIES = ("presence_penalty", "frequency_penalty", "repetition_penalty")


@dataclass(frozen=True)
class Defaults:
    """What a request that leaves a field out gets (the server's command-line options)."""

    max_tokens: int = DEFAULT_MAX_NEW_TOKENS
    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k
    seed: int | None = SamplingParams.seed
    presence_penalty: float = SamplingParams.presence_penalty
    frequency_penalty: float = SamplingParams.frequency_penalty
    repetition_penalty: float = SamplingParams.repetition_penalty
    think: bool | None = None


@dataclass(frozen=True)
class GenRequest:
    chat: bool  # /v1/chat/completions (else /v1/completions)
    prompt: Messages | str | list[int]  # messages; raw text; or token ids
    method: str
    sampling: SamplingParams
    max_tokens: int
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    think: bool | None
    tools: Tools | None = None  # chat with tools offered (serve/tools.py)
    ignore_eos: bool = False  # vLLM's: run to max_tokens whatever the model says
    echo: bool = False  # completions: the prompt's text (and logprobs) before the answer's
    response_format: dict | None = None  # the JSON Schema the answer is held to (None: text)
    max_tokens_given: bool = True  # False: the server's default, cut to the room left


def parse(body: Any, *, chat: bool, defaults: Defaults, methods: tuple[str, ...]) -> GenRequest:
    """`body` (parsed JSON) as a request; `methods[0]` serves requests that name none."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_type")
    for name, values in (HARMLESS | ({} if chat else COMPLETION_HARMLESS)).items():
        if (chat and name in TOOL_FIELDS) or name == "ignore_eos":
            continue  # honoured below
        if name in body and not any(_same(body[name], v) for v in values):
            raise invalid(
                f"{name}={_short(body[name])} is not supported by specgen (accepted: "
                f"{', '.join(_short(v) for v in values if v is not None) or 'null'})",
                name,
                "unsupported_value",
            )
    prompt = parse_messages(body) if chat else _prompt(body)
    tools = parse_tools(body) if chat else None
    max_tokens = _field(body, "max_completion_tokens", int)
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", int)
    echo = False if chat else bool(_field(body, "echo", bool, False))
    logprobs, logprobs_name = _logprobs(body, chat)
    settings = dict(
        temperature=_field(body, "temperature", float, defaults.temperature),
        top_p=_field(body, "top_p", float, defaults.top_p),
        top_k=_field(body, "top_k", int, defaults.top_k),
        seed=_field(body, "seed", int, defaults.seed),
        **{name: _field(body, name, float, getattr(defaults, name)) for name in PENALTIES},
    )
    try:  # the library's bounds, the ones the command line has: a 400 naming the field
        if max_tokens is not None and not (max_tokens == 0 and echo):  # 0: score the prompt
            checked_max_new_tokens(max_tokens)
        sampling = SamplingParams(**settings, logprobs=logprobs)
    except OptionError as e:
        name = {**API_NAMES, "logprobs": logprobs_name}.get(e.option, e.option)
        raise invalid(e.said_as(name), name) from None
    stream = bool(_field(body, "stream", bool, False))
    options = _field(body, "stream_options", dict, {})
    include_usage = _field(options, "include_usage", bool, False, "stream_options.")
    return GenRequest(
        chat=chat,
        prompt=prompt,
        method=_method(body, methods),
        sampling=sampling,
        max_tokens=defaults.max_tokens if max_tokens is None else max_tokens,
        stops=_stops(body),
        stream=stream,
        include_usage=bool(include_usage) and stream,
        think=_think(body, defaults.think),
        tools=tools,
        ignore_eos=bool(_field(body, "ignore_eos", bool, False)),
        echo=echo,
        response_format=response_format(body),
        max_tokens_given=max_tokens is not None,
    )


def response_format(body: dict) -> dict | None:
    """`response_format` as the JSON Schema the answer must match (None: free text):
    `{"type": "json_object"}` any object, `{"type": "json_schema", "json_schema":
    {"name", "schema", "strict"}}` that schema (strict or not, it is enforced)."""
    value = body.get("response_format")
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema", {}) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise invalid('response_format.json_schema must be {"name": ..., "schema": {...}}',
                          "response_format.json_schema", "invalid_type")  # fmt: skip
        return schema or {}
    raise invalid('response_format.type must be "text", "json_object" or "json_schema"',
                  "response_format", "unsupported_value")  # fmt: skip


def _logprobs(body: dict, chat: bool) -> tuple[int | None, str]:
    """How many likeliest tokens to report per position (None: no logprobs), and the
    field that says it. Chat: `logprobs: true` and `top_logprobs` (0-20); completions
    (legacy): `logprobs` (0-5; `false` or null: none)."""
    if chat:
        on = _field(body, "logprobs", bool, False)
        top = _field(body, "top_logprobs", int)
        if top and not on:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
        return (top or 0) if on else None, "top_logprobs"
    if body.get("logprobs") is False:
        return None, "logprobs"
    top = _field(body, "logprobs", int)
    if top is not None and not 0 <= top <= MAX_COMPLETION_LOGPROBS:
        raise invalid(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}] (got {top})", "logprobs")
    return top, "logprobs"


def _same(value: Any, harmless: Any) -> bool:
    if isinstance(value, bool) or isinstance(harmless, bool):
        return value is harmless
    return value == harmless


def _short(value: Any) -> str:
    import json

    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


_KINDS = {int: "an integer", float: "a number", bool: "a boolean", str: "a string",
          dict: "an object", list: "an array"}  # fmt: skip


def _field(body: dict, name: str, kind: type, default: Any = None, prefix: str = "") -> Any:
    """`body[name]` if it is of `kind` (a JSON null: `default`), else a 400 naming it."""
    value = body.get(name)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if kind is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        value = float(value) if ok else value
    if not ok:
        got = "null" if value is None else type(value).__name__
        raise invalid(
            f"{prefix}{name} must be {_KINDS[kind]} (got {got})", prefix + name, "invalid_type"
        )
    return value


def parse_messages(body: dict) -> Messages:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty array of messages", "messages", "invalid_type")
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(f"{where} must be an object", where, "invalid_type")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            roles = ", ".join(ROLES)
            raise invalid(f"{where}.role must be one of {roles} (got {_short(role)})",
                          f"{where}.role", "unsupported_value")  # fmt: skip
        calls = message.get("tool_calls")
        if calls and role != "assistant":
            raise invalid(f"{where}.tool_calls: only an assistant message makes calls",
                          f"{where}.tool_calls")  # fmt: skip
        content = message.get("content")
        if content is None and (calls or role == "assistant"):
            content = ""  # an assistant turn that only called tools
        entry: dict[str, Any] = {"role": ROLES[role], "content": _content(content, where)}
        if calls:
            entry["tool_calls"] = tool_calls_of(calls, f"{where}.tool_calls")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                entry[key] = _field(message, key, str, None, f"{where}.")
        out.append(entry)
    return out


def _content(content: Any, where: str) -> str:
    """A message's text: a string, or an array of text parts (joined by newlines)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise invalid(f"{where}.content: only text parts are supported",
                              f"{where}.content", "unsupported_value")  # fmt: skip
            texts.append(_field(part, "text", str, "", f"{where}.content[]."))
        return "\n".join(texts)
    raise invalid(f"{where}.content must be a string or an array of text parts",
                  f"{where}.content", "invalid_type")  # fmt: skip


def _prompt(body: dict) -> str | list[int]:
    """/v1/completions: one prompt, as text (no chat template) or as token ids."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return list(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        raise invalid("prompt: one prompt per request (batches are not supported)",
                      "prompt", "unsupported_value")  # fmt: skip
    raise invalid("prompt must be a string or an array of token ids", "prompt", "invalid_type")


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid("stop must be a string or an array of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise invalid(f"stop: at most {MAX_STOPS} strings (got {len(stops)})", "stop")
    return tuple(s for s in stops if s)


def _method(body: dict, methods: tuple[str, ...]) -> str:
    """The extension `"specgen": {"method": NAME}`: one of the loaded methods."""
    ext = _field(body, "specgen", dict, {})
    unknown = sorted(set(ext) - {"method"})
    if unknown:
        raise invalid(
            f"specgen.{unknown[0]}: unknown field (known: method)", f"specgen.{unknown[0]}"
        )
    method = _field(ext, "method", str, methods[0], "specgen.")
    if method not in methods:
        raise invalid(
            f"specgen.method {method!r} is not loaded; this server runs: {', '.join(methods)} "
            "(start it with --methods to load more)",
            "specgen.method",
            "unsupported_value",
        )
    return method


def _think(body: dict, default: bool | None) -> bool | None:
    """vLLM's `chat_template_kwargs: {"enable_thinking": bool}` (Qwen3's thinking mode)."""
    kwargs = _field(body, "chat_template_kwargs", dict, {})
    return _field(kwargs, "enable_thinking", bool, default, "chat_template_kwargs.")


# --- responses -----------------------------------------------------------------------------


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass(frozen=True)
class Reply:
    """The fields every body of one answer shares."""

    id: str
    created: int
    model: str
    chat: bool

    def _head(self, chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        obj = kind + (".chunk" if chunk and self.chat else "")
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def whole(
        self, text: str, finish: str, use: dict, spec: dict, logprobs: dict | None = None
    ) -> dict[str, Any]:
        """The non-streamed answer (`logprobs`: in serve/logprobs.py's shape for it)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": use, "specgen": spec}

    def chunk(
        self,
        text: str | None,
        finish: str | None = None,
        *,
        role: bool = False,
        spec: dict | None = None,
        logprobs: dict | None = None,
    ) -> dict[str, Any]:
        """One streamed chunk: a delta of text, or the finish (then `text` is None)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        body = {**self._head(True), "choices": [choice]}
        if spec is not None:
            body["specgen"] = spec
        return body

    def usage_chunk(self, use: dict, spec: dict) -> dict[str, Any]:
        """`stream_options.include_usage`: the last chunk, with no choices."""
        return {**self._head(True), "choices": [], "usage": use, "specgen": spec}
