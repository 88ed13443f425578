"""`POST /v1/responses`: OpenAI's Responses API, the subset agent SDKs send, answered by
the chat route's machinery (the request is translated into a chat request; the answer's
text and tool calls come back as the Responses API's output items).

In: `input` (a string, or items: messages with text parts, `function_call` and
`function_call_output`), `instructions`, `tools` (function tools, flat), `tool_choice`,
`parallel_tool_calls`, `text.format` (text, json_object, json_schema), `max_output_tokens`,
`temperature`, `top_p`, `stream`. Refused with a 400 naming the field: `previous_response_id`
and `conversation` (nothing is stored), built-in tools. Streaming sends the typed events
(`response.created`, `response.output_text.delta`, `response.output_item.done`, ...,
`response.completed`) the SDK reads.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from specgen.serve.errors import invalid
from specgen.serve.job import Delta, Done, Failed
from specgen.serve.jobs import Queued, collect, queue_job, read_json, sse_response
from specgen.serve.routing import Routes
from specgen.serve.service import CLIENT_CLOSED, Service
from specgen.serve.tool_calls import Call, Content

REFUSED = ("previous_response_id", "conversation", "background", "prompt")
PASSED = ("temperature", "top_p", "parallel_tool_calls", "stream", "seed", "user")


def add_responses_route(app: Routes, service: Service) -> None:
    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        body = await read_json(service, request)
        chat = chat_body(body)
        queued = await queue_job(service, chat, chat=True)
        out = Output(service.model, body, chat)
        if queued.req.stream:
            return sse_response(_stream(queued, out))
        whole = await collect(queued, request)
        if whole is None:
            return Response(status_code=CLIENT_CLOSED)
        items = ([out.message(whole.text)] if whole.text else []) + [
            out.call(c) for c in whole.calls
        ]
        return JSONResponse(out.response(items, whole.end))


def chat_body(body: Any) -> dict[str, Any]:
    """A Responses request as the chat request that answers it (a 400 naming the field
    for what it cannot honour)."""
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object", code="invalid_type")
    for name in REFUSED:
        if body.get(name) is not None:
            raise invalid(f"{name} is not supported by specgen (it stores no responses): "
                          "send the whole input", name, "unsupported_value")  # fmt: skip
    messages: list[dict] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions must be a string", "instructions", "invalid_type")
        messages.append({"role": "system", "content": instructions})
    messages += _messages(body.get("input"))
    chat: dict[str, Any] = {k: body[k] for k in PASSED if k in body}
    chat["messages"] = messages
    chat["max_tokens"] = body.get("max_output_tokens")
    if "model" in body:
        chat["model"] = body["model"]
    tools = body.get("tools")
    if tools is not None:
        chat["tools"] = _tools(tools)
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    if choice is not None:
        chat["tool_choice"] = choice
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None:
        chat["response_format"] = _format(fmt)
    return chat


def _messages(items: Any) -> list[dict]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise invalid("input must be a string or a non-empty array of items", "input",
                      "invalid_type")  # fmt: skip
    out: list[dict] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            out.append({"role": item.get("role"), "content": _text(item.get("content"), where)})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            }
            if out and out[-1]["role"] == "assistant" and out[-1].get("tool_calls"):
                out[-1]["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else json.dumps(output)
            out.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": text})
        elif kind == "reasoning":
            continue  # a reasoning model's notes: not part of the prompt here
        else:
            raise invalid(f"{where}: items of type {kind!r} are not supported (message, "
                          "function_call, function_call_output)", where,
                          "unsupported_value")  # fmt: skip
    return out


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in (
                "input_text", "output_text", "text"
            ):  # fmt: skip
                raise invalid(f"{where}.content: only text parts are supported",
                              f"{where}.content", "unsupported_value")  # fmt: skip
            texts.append(str(part.get("text", "")))
        return "\n".join(texts)
    raise invalid(f"{where}.content must be a string or an array of text parts",
                  f"{where}.content", "invalid_type")  # fmt: skip


def _tools(tools: Any) -> Any:
    if not isinstance(tools, list):
        return tools  # the chat parser says what is wrong with it
    out = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise invalid(f"tools[{i}]: only function tools are supported (got {kind!r})",
                          f"tools[{i}]", "unsupported_value")  # fmt: skip
        fn = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        out.append({"type": "function", "function": fn})
    return out


def _format(fmt: Any) -> Any:
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"),
                "schema": fmt.get("schema", {}), "strict": fmt.get("strict")}}  # fmt: skip
    return fmt


class Output:
    """The Responses API's objects for one answer."""

    def __init__(self, model: str, body: dict, chat: dict) -> None:
        self.id = "resp_" + uuid.uuid4().hex[:24]
        self.msg_id = "msg_" + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model, self.body, self.chat = model, body, chat

    def message(self, text: str, status: str = "completed") -> dict:
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
        return {"type": "message", "id": self.msg_id, "status": status, "role": "assistant",
                "content": [part] if status == "completed" else []}  # fmt: skip

    def call(self, call: Call) -> dict:
        return {"type": "function_call", "id": "fc_" + call.id.removeprefix("call_"),
                "call_id": call.id, "name": call.name, "arguments": call.arguments,
                "status": "completed"}  # fmt: skip

    def response(self, output: list[dict], end: Done | None = None) -> dict:
        body = self.body
        text_format = (body.get("text") or {}).get("format") if isinstance(
            body.get("text"), dict) else None  # fmt: skip
        out: dict[str, Any] = {
            "id": self.id, "object": "response", "created_at": self.created,
            "status": "in_progress", "model": self.model, "output": output, "error": None,
            "incomplete_details": None, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"), "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "text": {"format": text_format or {"type": "text"}}, "usage": None,
        }  # fmt: skip
        if end is not None:
            prompt, completion, cached = end.usage
            cut = end.finish == "length"
            out["status"] = "incomplete" if cut else "completed"
            if cut:
                out["incomplete_details"] = {"reason": "max_output_tokens"}
            out["usage"] = {
                "input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": completion,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": prompt + completion,
            }  # fmt: skip
            out["specgen"] = end.spec
        return out


async def _stream(queued: Queued, out: Output) -> AsyncIterator[str]:
    """The typed events of a streamed response, in the order the SDK expects."""
    job, events, calls = queued.job, queued.events, queued.calls
    seq = 0
    items: list[dict] = []
    text: list[str] = []
    message_at: int | None = None  # the message's output index, once opened

    def event(kind: str, **fields: Any) -> str:
        nonlocal seq
        seq += 1
        payload = {"type": kind, "sequence_number": seq - 1, **fields}
        return f"event: {kind}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"

    def content(piece: str) -> list[str]:
        nonlocal message_at
        sent = []
        if message_at is None:
            message_at = len(items)
            items.append(out.message("", status="in_progress"))
            sent.append(event("response.output_item.added", output_index=message_at,
                              item=items[message_at]))  # fmt: skip
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            sent.append(event("response.content_part.added", item_id=out.msg_id,
                              output_index=message_at, content_index=0, part=part))  # fmt: skip
        text.append(piece)
        sent.append(event("response.output_text.delta", item_id=out.msg_id,
                          output_index=message_at, content_index=0, delta=piece,
                          logprobs=[]))  # fmt: skip
        return sent

    def close_message() -> list[str]:
        if message_at is None:
            return []
        whole = "".join(text)
        items[message_at] = out.message(whole)
        part = items[message_at]["content"][0]
        return [
            event("response.output_text.done", item_id=out.msg_id, output_index=message_at,
                  content_index=0, text=whole, logprobs=[]),
            event("response.content_part.done", item_id=out.msg_id, output_index=message_at,
                  content_index=0, part=part),
            event("response.output_item.done", output_index=message_at, item=items[message_at]),
        ]  # fmt: skip

    def call(read: Call) -> list[str]:
        item = out.call(read)
        index = len(items)
        items.append(item)
        opened = {**item, "arguments": "", "status": "in_progress"}
        return [
            event("response.output_item.added", output_index=index, item=opened),
            event("response.function_call_arguments.delta", item_id=item["id"],
                  output_index=index, delta=item["arguments"]),
            event("response.function_call_arguments.done", item_id=item["id"],
                  output_index=index, arguments=item["arguments"]),
            event("response.output_item.done", output_index=index, item=item),
        ]  # fmt: skip

    def read(pieces: list) -> list[str]:
        sent = []
        for piece in pieces:
            if isinstance(piece, Content):
                sent += content(piece.text) if piece.text else []
            else:
                sent += call(piece)  # the message (if any) stays open: closed at the end
        return sent

    try:
        yield event("response.created", response=out.response([]))
        yield event("response.in_progress", response=out.response([]))
        while True:
            ev = await events.get()
            if isinstance(ev, Delta):
                for line in read([Content(ev.text)] if calls is None else calls.push(ev.text)):
                    yield line
                continue
            if isinstance(ev, Failed):
                failed = out.response(items)
                failed["status"] = "failed"
                failed["error"] = {"code": ev.error.code or "server_error",
                                   "message": ev.error.message}  # fmt: skip
                yield event("response.failed", response=failed)
                return
            for line in read([] if calls is None else calls.flush()):
                yield line
            for line in close_message():
                yield line
            yield event("response.completed", response=out.response(items, ev))
            return
    finally:
        job.cancel.set()
