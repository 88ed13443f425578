"""OpenAI's `tools` / `tool_choice` / `parallel_tool_calls` in, and the prompt that
carries them: rendered by the model's own chat template (transformers'
`apply_chat_template(tools=...)`), as llama-server, vLLM and Ollama do.

A template that never reads `tools` gets the generic format instead
(serve/generic_tools.py: the tools in a system message, the answer held by constrained
decoding to the call JSON or a reply).

`tool_choice`:
- `auto`: the tools are in the prompt; the model decides, its calls are parsed back.
- `none`: the tools are left out of the prompt and nothing is parsed (never refused).
- `required` / a named function: the assistant's turn is made to start with the call's
  opener (and the name), in the format the template teaches (`tool_formats.Format.prefix`);
  the model writes the rest. Decoding is unchanged from there on, so speculation stays
  lossless: the answer is what the target itself writes after that opening. Nothing
  constrains the rest to be a valid call; one that does not parse is returned as content.
  A forced call turns thinking off for the turn (the opener comes first).

With the template's own format decoding is not touched: only the prompt's rendering and
the answer's parsing are new.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specgen.serve import generic_tools
from specgen.serve.errors import invalid
from specgen.serve.tool_calls import Call, Content
from specgen.serve.tool_formats import GENERIC, Format, format_of

if TYPE_CHECKING:
    from specgen.text.codec import TextCodec

TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass(frozen=True)
class Tools:
    """What a chat request asked of tools (None on GenRequest: no tools in play)."""

    tools: tuple[dict, ...] = ()
    choice: str = "auto"  # auto | none | required | function
    name: str | None = None  # tool_choice naming one function
    parallel: bool = True
    schemas: dict[str, dict] = field(default_factory=dict)  # name -> its parameters

    @property
    def parsing(self) -> bool:
        return bool(self.tools) and self.choice != "none"


def parse_tools(body: dict) -> Tools | None:
    """`tools`, `tool_choice` and `parallel_tool_calls` checked, or a 400 naming the field."""
    raw = body.get("tools")
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise invalid("tools must be an array of tools", "tools", "invalid_type")
    tools, schemas = [], {}
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise invalid(f'{where} must be {{"type": "function", "function": {{...}}}}', where)
        fn = tool.get("function")
        if not isinstance(fn, dict):
            raise invalid(f"{where}.function must be an object", f"{where}.function",
                          "invalid_type")  # fmt: skip
        name = fn.get("name")
        if not isinstance(name, str) or not name.strip() or any(c in name for c in "<>{}\n\"'"):
            raise invalid(f"{where}.function.name must be a plain non-empty string",
                          f"{where}.function.name")  # fmt: skip
        params = fn.get("parameters", {})
        if params is not None and not isinstance(params, dict):
            raise invalid(f"{where}.function.parameters must be a JSON Schema object",
                          f"{where}.function.parameters", "invalid_type")  # fmt: skip
        if name in schemas:
            raise invalid(f"{where}: a second tool named {name!r}", f"{where}.function.name")
        desc = fn.get("description")
        if desc is not None and not isinstance(desc, str):
            raise invalid(f"{where}.function.description must be a string",
                          f"{where}.function.description", "invalid_type")  # fmt: skip
        schemas[name] = params or {}
        clean = {"name": name, "description": desc or "", "parameters": params or {}}
        tools.append({"type": "function", "function": clean})
    choice, chosen = _choice(body.get("tool_choice"), schemas)
    parallel = body.get("parallel_tool_calls", True)
    if parallel is None:
        parallel = True
    if not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls must be a boolean", "parallel_tool_calls",
                      "invalid_type")  # fmt: skip
    if not tools:
        return None
    return Tools(tuple(tools), choice, chosen, parallel, schemas)


def _choice(value: Any, schemas: dict[str, dict]) -> tuple[str, str | None]:
    if value is None:
        return "auto", None
    if value in ("auto", "none"):
        return value, None
    if value == "required" or isinstance(value, dict):
        if not schemas:
            raise invalid(f"tool_choice={json.dumps(value)[:60]} needs tools", "tool_choice")
        if value == "required":
            return "required", None
        fn = value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if value.get("type", "function") != "function" or not isinstance(name, str):
            raise invalid('tool_choice must be "auto", "none", "required" or {"type": '
                          '"function", "function": {"name": NAME}}', "tool_choice")  # fmt: skip
        if name not in schemas:
            raise invalid(f"tool_choice names {name!r}, which is not in tools "
                          f"({', '.join(schemas)})", "tool_choice")  # fmt: skip
        return "function", name
    raise invalid('tool_choice must be "auto", "none", "required" or a named function',
                  "tool_choice", "unsupported_value")  # fmt: skip


# --- the history's tool messages -------------------------------------------------------------


def tool_calls_of(value: Any, where: str) -> list[dict]:
    """An assistant message's `tool_calls` for a template: arguments as an object
    (templates iterate them, or write them with `tojson`)."""
    if not isinstance(value, list):
        raise invalid(f"{where} must be an array", where, "invalid_type")
    out = []
    for j, call in enumerate(value):
        here = f"{where}[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(f"{here} must have function.name", f"{here}.function", "invalid_type")
        args = fn.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except (json.JSONDecodeError, RecursionError):
                args = None
        if not isinstance(args, dict):
            raise invalid(f"{here}.function.arguments must be a JSON object (as a string)",
                          f"{here}.function.arguments")  # fmt: skip
        call_id = call.get("id")
        entry = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
        if isinstance(call_id, str):
            entry["id"] = call_id
        out.append(entry)
    return out


def uses_tools(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


# --- rendering ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rendered:
    ids: list[int]
    fmt: Format | None  # how to read calls back (None: no parsing)
    primed: str  # what the answer was made to start with
    schema: dict | None = None  # the JSON Schema the answer is held to (generic format)


def render(codec: TextCodec, messages: list[dict], tools: Tools | None, think: bool) -> Rendered:
    """The prompt's ids through the model's template, tools included."""
    tok = codec.tokenizer
    offered = list(tools.tools) if tools is not None and tools.choice != "none" else None
    try:
        template = tok.get_chat_template(tools=offered)
    except (ValueError, TypeError):
        template = None
    if not template:
        raise invalid(f"{codec.name} has no chat template", "messages")
    if not _reads_tools(template):
        return _generic(codec, messages, tools, think)
    fmt = format_of(template)
    if fmt is None and tools is not None and tools.parsing:
        raise invalid(f"{codec.name}'s chat template writes tool calls in a format specgen "
                      "cannot read (known: Qwen3 <tool_call> JSON, Qwen3.5 XML, Llama 3.1 "
                      "JSON, Gemma 4)", "tools", "unsupported_value")  # fmt: skip
    forced = tools is not None and tools.choice in ("required", "function")
    primed = fmt.prefix(tools.name) if forced and fmt is not None else ""
    history = _for_template(messages, template)
    text = tok.apply_chat_template(
        history, tools=offered, add_generation_prompt=True, tokenize=False,
        enable_thinking=think and not forced,
    )  # fmt: skip
    ids = tok(text + primed, add_special_tokens=False)["input_ids"]
    parsing = tools is not None and tools.parsing
    return Rendered(list(ids), fmt if parsing else None, primed)


def _generic(codec: TextCodec, messages: list[dict], tools: Tools | None, think: bool) -> Rendered:
    """A template without tools: llama.cpp's generic format (serve/generic_tools.py)."""
    history = generic_tools.history(messages, tools)
    text = codec.tokenizer.apply_chat_template(
        history, add_generation_prompt=True, tokenize=False, enable_thinking=think
    )
    ids = codec.tokenizer(text, add_special_tokens=False)["input_ids"]
    if tools is None or not tools.parsing:
        return Rendered(list(ids), None, "")
    return Rendered(list(ids), GENERIC, "", generic_tools.schema(tools))


def _reads_tools(template: str) -> bool:
    """Whether the template reads a `tools` variable (those that cannot, never say it)."""
    import jinja2
    from jinja2 import meta

    try:
        env = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"])
        names = meta.find_undeclared_variables(env.parse(template))
    except jinja2.TemplateSyntaxError:
        return "tools" in template
    return "tools" in names or "custom_tools" in names


def _for_template(messages: list[dict], template: str) -> list[dict]:
    """Gemma 4's template takes tool results as `tool_responses` on the model's turn
    that called them, not as `role: "tool"` messages: moved there, by the call's name."""
    if "tool_responses" not in template:
        return messages
    out: list[dict] = []
    for m in messages:
        caller = out[-1] if out and out[-1].get("tool_calls") else None
        if m.get("role") != "tool" or caller is None:
            out.append(dict(m))
            continue
        names = {c.get("id"): c["function"]["name"] for c in caller["tool_calls"]}
        done = len(caller.setdefault("tool_responses", []))
        name = names.get(m.get("tool_call_id")) or m.get("name")
        if name is None:
            calls = caller["tool_calls"]
            name = calls[min(done, len(calls) - 1)]["function"]["name"]
        content = m.get("content") or ""
        try:
            response = json.loads(content)
        except (json.JSONDecodeError, RecursionError):
            response = content
        caller["tool_responses"].append({"name": name, "response": response})
    return out


def special_text(codec: TextCodec):
    """`Job.text_of` for formats whose markers are special tokens (Gemma 4's
    `<|tool_call>`), which the pipeline's text leaves out: the answer decoded with them,
    stop tokens dropped. Its characters are not told apart as drafted (0)."""
    from specgen.text.codec import Detokenizer

    class _Keeping:
        def decode(self, ids: list[int]) -> str:
            return codec.decode(ids, skip_special=False)

    detok = Detokenizer(_Keeping())  # type: ignore[arg-type]

    def text_of(chunk: Any) -> tuple[str, int]:
        text = detok.push([t for t in chunk.token_ids if t not in codec.stop_ids])
        if chunk.stats.finish_reason is not None:
            text += detok.flush()
        return text, 0

    return text_of


# --- the answer's calls in OpenAI's shapes -----------------------------------------------------


def finish_reason(finish: str, calls: int) -> str:
    """ "tool_calls" for an answer that ended by itself after calling; a cut one keeps
    its reason ("length")."""
    return "tool_calls" if calls and finish == "stop" else finish


def with_calls(body: dict, calls: list[Call]) -> None:
    """A whole answer's body with its calls: content null when there is none besides."""
    choice = body["choices"][0]
    choice["message"]["content"] = choice["message"]["content"] or None
    choice["message"]["tool_calls"] = [c.body() for c in calls]
    choice["finish_reason"] = finish_reason(choice["finish_reason"], len(calls))


def streamed(reply: Any, read: Content | Call, event: Any) -> dict:
    """One chunk: content (its drafted count kept only if the text is the step's own),
    or a call, whole, at the index it has among the answer's calls."""
    if isinstance(read, Content):
        own = read.text == getattr(event, "text", None)
        spec = event.spec if own else {**event.spec, "drafted_chars": 0}
        return reply.chunk(read.text, spec=spec)
    chunk = reply.chunk(None, spec={**event.spec, "drafted_chars": 0})
    chunk["choices"][0]["delta"] = {"tool_calls": [read.body(read.index)]}
    return chunk
