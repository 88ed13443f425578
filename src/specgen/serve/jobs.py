"""A request's way to the worker and back, shared by the routes that generate (chat,
completions, responses): the body read within its limits, tokenized off the event loop,
checked against the context, queued as a `Job`; then its events read to the end.

Every job posts exactly one end event (serve/worker.py); a handler waiting for a whole
answer also returns as soon as its client disconnects (`collect`), so no handler waits
on a job whose client is gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

from starlette.requests import Request
from starlette.responses import StreamingResponse

from specgen.core.errors import SpecgenError
from specgen.serve import limits
from specgen.serve import tools as tooling
from specgen.serve.errors import APIError, invalid
from specgen.serve.job import Delta, Done, Failed, Job, Overloaded
from specgen.serve.logprobs import Entry
from specgen.serve.openai_api import GenRequest, parse
from specgen.serve.service import Service
from specgen.serve.tool_calls import Call, Content, ToolStream

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.verify.constraint import Constraint


async def read_json(service: Service, request: Request) -> Any:
    """The request's body as JSON, within the size limit and the body timeout."""
    if service.draining:
        raise APIError(503, "the server is stopping", code="shutting_down")
    chunks = request.stream()
    raw = await limits.read_body_within(
        request.headers, chunks, service.max_body_bytes, service.body_timeout
    )
    return limits.parse_json(raw)


def sse_response(events: AsyncIterator[str]) -> StreamingResponse:
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(events, media_type="text/event-stream", headers=headers)


async def queue_job(service: Service, body: Any, *, chat: bool) -> Queued:
    """A parsed body as a job on the worker's queue."""
    model = body.get("model") if isinstance(body, dict) else None
    if model is not None and not isinstance(model, str):
        raise invalid(
            f"model must be a string (got {type(model).__name__})", "model", "invalid_type"
        )
    if model not in (None, "", *service.names):
        raise APIError(
            404,
            f"model {model!r} is not served here; this server runs {service.model!r}",
            param="model",
            code="model_not_found",
        )
    req = parse(body, chat=chat, defaults=service.defaults, methods=service.methods)
    pipe = service.pipes[req.method]
    loop = asyncio.get_running_loop()
    ids, rendered, constraint = await loop.run_in_executor(service.encoder, _encode, pipe, req)
    param = "messages" if chat else "prompt"
    if len(ids) >= pipe.context:
        raise context_exceeded(len(ids), pipe.context, param)
    max_tokens = req.max_tokens
    if len(ids) + max_tokens > pipe.context:
        if req.max_tokens_given:  # OpenAI's and vLLM's answer: the request cannot be met
            raise context_exceeded(len(ids), pipe.context, param, asked=max_tokens)
        max_tokens = pipe.context - len(ids)  # the server's default: the room there is
    if rendered is not None and req.sampling.logprobs is not None:
        raise invalid(
            "logprobs are not supported with tools or tool messages", "logprobs",
            "unsupported_value",
        )  # fmt: skip
    events: asyncio.Queue = asyncio.Queue()
    job = Job(
        req.method, ids, req.sampling, max_tokens, req.stops,
        post=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        text_of=tooling.special_text(pipe.codec) if rendered and rendered.fmt
        and rendered.fmt.keeps_special else None,
        ignore_eos=req.ignore_eos, echo=req.echo, constraint=constraint,
    )  # fmt: skip
    try:
        service.worker.submit(job)
    except Overloaded as e:
        raise APIError(
            503,
            f"the server is busy (its queue of {service.worker.queued} is full); retry in "
            f"{e.retry_after} s",
            code="overloaded",
            headers={"Retry-After": str(e.retry_after)},
        ) from None
    return Queued(req, job, events, rendered)


class Queued(NamedTuple):
    req: GenRequest
    job: Job
    events: asyncio.Queue  # the job's Delta events, then its one end event (or GONE)
    rendered: tooling.Rendered | None

    @property
    def calls(self) -> ToolStream | None:
        return tool_stream(self.req, self.rendered)


def tool_stream(req: GenRequest, rendered: tooling.Rendered | None) -> ToolStream | None:
    """Where the answer's tool calls are read, when tools are offered (else None)."""
    if rendered is None or rendered.fmt is None or req.tools is None:
        return None
    single = not req.tools.parallel
    return ToolStream(rendered.fmt, req.tools.schemas, rendered.primed, single)


def _encode(
    pipe: Pipeline, req: GenRequest
) -> tuple[list[int], tooling.Rendered | None, Constraint | None]:
    """The prompt's token ids (messages through the chat template, text as it is), how
    tools were rendered when they are in play, and the answer's constraint (the generic
    tool format's, or `response_format`'s)."""
    ids, rendered = _ids(pipe, req)
    schema, param = req.response_format, "response_format"
    if rendered is not None and rendered.schema is not None:
        schema, param = rendered.schema, "tools"
    if schema is None:
        return ids, rendered, None
    from specgen.serve import grammar as structured  # torch: not on the server's start

    vocab = pipe.vocab_size
    grammar = structured.json_schema_grammar(schema, param)
    return ids, rendered, structured.compile(pipe.codec, vocab, grammar, param)


def _ids(pipe: Pipeline, req: GenRequest) -> tuple[list[int], tooling.Rendered | None]:
    import jinja2

    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
        vocab = pipe.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < vocab]  # type: ignore[operator]
        if bad:
            raise invalid(f"prompt: token id {bad[0]} is not in [0, {vocab})", "prompt")
        return list(req.prompt), None  # type: ignore[arg-type]
    param = "messages" if req.chat else "prompt"
    _refuse_certainly_too_long(pipe, req, param)
    try:
        messages = req.prompt
        offered = req.tools is not None and req.tools.choice != "none"
        if req.chat and (offered or tooling.uses_tools(messages)):  # type: ignore[arg-type]
            think = bool(pipe.thinking) if req.think is None else req.think
            rendered = tooling.render(pipe.codec, messages, req.tools, think)  # type: ignore[arg-type]
            return rendered.ids, rendered
        return pipe.encode(messages, raw=not req.chat, think=req.think), None  # type: ignore[arg-type]
    except SpecgenError as e:
        raise invalid(str(e), param) from None
    except jinja2.TemplateError as e:  # the model's template refused these messages
        raise invalid(f"the chat template refused the messages: {e}", param) from None


def _refuse_certainly_too_long(pipe: Pipeline, req: GenRequest, param: str) -> None:
    """A 413 for a prompt whose length alone proves it cannot fit, before tokenizing it
    all (a 20 MB prompt would hold the encoder for seconds)."""
    if isinstance(req.prompt, str):
        text = req.prompt
    else:
        text = "\n".join(str(m.get("content") or "") for m in req.prompt)  # type: ignore[union-attr]
    codec = getattr(pipe, "codec", None)
    if codec is None:  # a stand-in pipeline (tests): nothing to measure with
        return
    longest = _LONGEST.get(id(codec))
    if longest is None:
        longest = _LONGEST[id(codec)] = limits.longest_token_chars(codec)

    def count(sample: str) -> int:
        return len(codec.encode_raw(sample, special=False))

    tokens = limits.certainly_too_long(text, pipe.context, longest, count)
    if tokens is not None:
        raise context_exceeded(tokens, pipe.context, param, at_least=True)


_LONGEST: dict[int, int] = {}  # codec -> its longest token in characters


def context_exceeded(
    tokens: int, context: int, param: str, *, asked: int | None = None, at_least: bool = False
) -> APIError:
    """OpenAI's 400 for a request that cannot fit: clients (the openai SDK, LangChain's
    overflow handling) look for `context_length_exceeded`."""
    said = f"at least {tokens}" if at_least else str(tokens)
    if asked is None:
        why = f"the prompt is {said} tokens (leave room for at least one new token)"
    else:
        why = f"the prompt is {said} tokens and max_tokens asks for {asked} more"
    return APIError(
        400,
        f"This model's maximum context length is {context} tokens, but {why}; shorten the "
        "prompt or max_tokens (the server's --context sets the context)",
        param="max_tokens" if asked is not None else param,
        code="context_length_exceeded",
    )


GONE = object()  # put on a job's events when its client disconnects


class Whole(NamedTuple):
    text: str  # content (tool calls taken out)
    calls: list[Call]
    entries: list[Entry]  # logprobs
    end: Done


async def collect(queued: Queued, request: Request) -> Whole | None:
    """A job's whole answer, or None when the client left first (the generation is then
    stopped, and the handler returns at once rather than waiting on the worker)."""
    job, events, calls = queued.job, queued.events, queued.calls

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel.set()
        events.put_nowait(GONE)

    watcher = asyncio.create_task(watch())
    text: list[str] = []
    entries: list[Entry] = []
    try:
        while True:
            event = await events.get()
            if event is GONE:
                return None
            if isinstance(event, Delta):
                text.append(event.text)
                entries += event.logprobs
            elif isinstance(event, Failed):
                raise event.error
            else:
                answer = "".join(text)
                found: list[Call] = []
                if calls is not None:
                    read = calls.push(answer) + calls.flush()
                    answer = "".join(e.text for e in read if isinstance(e, Content))
                    found = [e for e in read if isinstance(e, Call)]
                return Whole(answer, found, entries, event)
    finally:
        watcher.cancel()
        job.cancel.set()  # a no-op once the job is done
