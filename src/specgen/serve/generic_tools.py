"""Tools for a model whose chat template has none (SmolLM2's, many base and small
models'): llama.cpp's generic format. The tools go into a system message that says what
JSON to answer with; the answer is held to that JSON by constrained decoding
(serve/grammar.py), so whatever the model writes is either calls or a reply, and
`tool_formats.GenericJSON` reads it back:

    {"tool_calls": [{"name": N, "arguments": {...}}, ...]}   or   {"response": TEXT}

`tool_choice` "required" or a named function leaves only the first shape (and the named
function); `parallel_tool_calls: false` allows one call. A history's calls and results
are written in the same JSON, as an assistant's and a user's message, so any template
renders them.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specgen.serve.tools import Tools


def schema(tools: Tools) -> dict[str, Any]:
    """The JSON Schema of an answer to `tools`."""
    offered = [t["function"] for t in tools.tools]
    if tools.choice == "function":
        offered = [f for f in offered if f["name"] == tools.name]
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object"},
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for f in offered
    ]
    items = variants[0] if len(variants) == 1 else {"anyOf": variants}
    calls: dict[str, Any] = {"type": "array", "items": items, "minItems": 1}
    if not tools.parallel:
        calls["maxItems"] = 1
    call = {"type": "object", "properties": {"tool_calls": calls}, "required": ["tool_calls"],
            "additionalProperties": False}  # fmt: skip
    if tools.choice in ("required", "function"):
        return call
    reply = {"type": "object", "properties": {"response": {"type": "string"}},
             "required": ["response"], "additionalProperties": False}  # fmt: skip
    return {"anyOf": [call, reply]}


def instructions(tools: Tools) -> str:
    """The system message's text that teaches the format."""
    listed = "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools.tools)
    if tools.choice in ("required", "function"):
        must = (f'You must call the tool "{tools.name}".' if tools.choice == "function"
                else "You must call one of the tools.")  # fmt: skip
        how = 'Answer with {"tool_calls": [{"name": "<tool name>", "arguments": {...}}]}.'
    else:
        must = "Call tools when they help; otherwise reply to the user directly."
        how = ('Answer with {"tool_calls": [{"name": "<tool name>", "arguments": {...}}]} '
               'to call tools, or with {"response": "<your reply>"} to reply.')  # fmt: skip
    return (f"You have these tools:\n{listed}\n\n{must} Answer with one JSON object and "
            f"nothing else. {how}")  # fmt: skip


def history(messages: list[dict], tools: Tools | None) -> list[dict]:
    """`messages` as a template without tools can render them: the instructions in the
    system message (when tools are offered), calls and results as JSON text."""
    out: list[dict] = []
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in m["tool_calls"]]  # fmt: skip
            out.append(
                {
                    "role": "assistant",
                    "content": json.dumps({"tool_calls": calls}, ensure_ascii=False),
                }
            )
        elif role == "tool":
            result = {"tool_response": {"name": m.get("name"), "id": m.get("tool_call_id"),
                                        "content": content}}  # fmt: skip
            out.append({"role": "user", "content": json.dumps(result, ensure_ascii=False)})
        else:
            out.append({"role": role, "content": content})
    if tools is not None and tools.parsing:
        text = instructions(tools)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out
