"""The HTTP side: FastAPI routes that parse, queue a job for the worker and stream its
events back. Nothing here touches torch; tokenizing runs in a thread of its own.

Streaming is Starlette's `StreamingResponse` writing `data: {json}\\n\\n` lines, rather than
sse-starlette or FastAPI's newer SSE support: the framing is one f-string, the class is
in every Starlette version the dependency range allows, and it cancels the body iterator
when the client disconnects, which is what stops the generation at its next step.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException
from starlette.responses import StreamingResponse

from specgen.core.errors import SpecgenError
from specgen.serve import limits
from specgen.serve import tools as tooling
from specgen.serve.errors import APIError, invalid
from specgen.serve.log import Log
from specgen.serve.logprobs import Entry, chat_logprobs, completion_logprobs
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults, GenRequest, Reply, parse, usage
from specgen.serve.tokenizing import add_routes as add_tokenizer_routes
from specgen.serve.tool_calls import Call, Content, ToolStream
from specgen.serve.worker import Delta, Failed, Job, Overloaded, Worker

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline

STATIC = Path(__file__).resolve().parent / "static"  # the web view (index.html and assets)
OPEN_PATHS = ("/health", "/", "/favicon.ico")  # no API key needed (also /static/...)
UNAUTHORIZED = APIError(
    401,
    "a valid API key is required (Authorization: Bearer KEY)",
    code="invalid_api_key",
    headers={"WWW-Authenticate": "Bearer"},
)


@dataclass
class Service:
    """What the routes share: the worker and its pipelines, the settings, the counters."""

    worker: Worker
    model: str  # the served model id
    names: frozenset[str]  # what a request's `model` may say
    defaults: Defaults
    metrics: Metrics
    api_key: str | None = None
    debug: bool = False
    log: Log = Log()  # where internal errors are said
    draining: bool = False  # stopping: new requests get 503
    max_body_bytes: int = limits.DEFAULT_MAX_BODY_BYTES
    started: int = field(default_factory=lambda: int(time.time()))
    encoder: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="specgen-encode")
    )

    @property
    def pipes(self) -> dict[str, Pipeline]:
        return self.worker.pipes

    @property
    def methods(self) -> tuple[str, ...]:
        return tuple(self.pipes)  # the first serves requests that name no method


def build_app(service: Service) -> FastAPI:
    app = FastAPI(title="specgen", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service = service

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return error_response(e)

    @app.exception_handler(Exception)
    async def _bug(request: Request, e: Exception) -> JSONResponse:
        # answered here; GuardedApp, which sees it raised again, logs it
        return error_response(
            APIError(500, f"internal error: {type(e).__name__}", code="internal_error")
        )

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
        message = f"{request.method} {request.url.path}: {e.detail}"
        return error_response(APIError(e.status_code, message, code=code))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {
            "status": "stopping" if service.draining else "ok",
            "model": service.model,
            "methods": list(service.methods),
            "queued": service.worker.queued,
            "running": service.worker.running,
        }

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        pipe = service.pipes[service.methods[0]]
        card = {
            "id": service.model,
            "object": "model",
            "created": service.started,
            "owned_by": "specgen",
            "max_model_len": pipe.context,
            "specgen": {"methods": list(service.methods), "aliases": sorted(service.names)},
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await answer(service, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(service, request, chat=False)

    if (STATIC / "index.html").is_file():

        @app.get("/")
        async def page() -> FileResponse:
            return FileResponse(STATIC / "index.html")

    add_tokenizer_routes(app, lambda: service.pipes[service.methods[0]], service)
    if STATIC.is_dir():
        app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return GuardedApp(app, service)


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def answer(service: Service, request: Request, *, chat: bool) -> Response:
    """Parse, tokenize, queue; then stream the job's events or wait for its end."""
    if service.draining:
        raise APIError(503, "the server is stopping", code="shutting_down")
    raw = await limits.read_body(request.headers, request.stream(), service.max_body_bytes)
    body = limits.parse_json(raw)
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
    ids, rendered = await loop.run_in_executor(service.encoder, _encode, pipe, req)
    if len(ids) >= pipe.context:
        raise _context_exceeded(str(len(ids)), pipe.context, "messages" if chat else "prompt")
    if rendered is not None and req.sampling.logprobs is not None:
        raise invalid(
            "logprobs are not supported with tools or tool messages", "logprobs",
            "unsupported_value",
        )  # fmt: skip
    events: asyncio.Queue = asyncio.Queue()
    job = Job(
        req.method, ids, req.sampling, req.max_tokens, req.stops,
        post=lambda event: loop.call_soon_threadsafe(events.put_nowait, event),
        text_of=tooling.special_text(pipe.codec) if rendered and rendered.fmt
        and rendered.fmt.keeps_special else None,
        ignore_eos=req.ignore_eos, echo=req.echo,
    )  # fmt: skip
    try:
        service.worker.submit(job)
    except Overloaded as e:
        raise APIError(
            503,
            f"the server is busy (its queue of {service.worker.queued} is full); retry later",
            code="overloaded",
            headers={"Retry-After": str(e.retry_after)},
        ) from None
    prefix = "chatcmpl-" if chat else "cmpl-"
    reply = Reply(prefix + uuid.uuid4().hex[:24], int(time.time()), service.model, chat)
    if req.stream:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        sse = _stream(job, events, reply, req, _tool_stream(req, rendered))
        return StreamingResponse(sse, media_type="text/event-stream", headers=headers)
    return await _whole(job, events, reply, request, _tool_stream(req, rendered))


def _tool_stream(req: GenRequest, rendered: tooling.Rendered | None) -> ToolStream | None:
    """Where the answer's tool calls are read, when tools are offered (else None)."""
    if rendered is None or rendered.fmt is None or req.tools is None:
        return None
    single = not req.tools.parallel
    return ToolStream(rendered.fmt, req.tools.schemas, rendered.primed, single)


def _encode(pipe: Pipeline, req: GenRequest) -> tuple[list[int], tooling.Rendered | None]:
    """The prompt's token ids (messages through the chat template, text as it is), and
    how tools were rendered when they are in play."""
    import jinja2

    if isinstance(req.prompt, list) and req.prompt and isinstance(req.prompt[0], int):
        vocab = pipe.model.args.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < vocab]  # type: ignore[operator]
        if bad:
            raise invalid(f"prompt: token id {bad[0]} is not in [0, {vocab})", "prompt")
        return list(req.prompt), None  # type: ignore[arg-type]
    param = "messages" if req.chat else "prompt"
    _refuse_certainly_too_long(pipe, req, param)
    try:
        if req.chat and (req.tools is not None or tooling.uses_tools(req.prompt)):  # type: ignore[arg-type]
            think = bool(pipe.thinking) if req.think is None else req.think
            rendered = tooling.render(pipe.codec, req.prompt, req.tools, think)  # type: ignore[arg-type]
            return rendered.ids, rendered
        return pipe.encode(req.prompt, raw=not req.chat, think=req.think), None  # type: ignore[arg-type]
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
        raise _context_exceeded(f"at least {tokens}", pipe.context, param)


_LONGEST: dict[int, int] = {}  # codec -> its longest token in characters


def _context_exceeded(tokens: str, context: int, param: str) -> APIError:
    return APIError(
        413,
        f"the prompt is {tokens} tokens but the context is {context} (leave room for "
        "at least one new token; the server's --context sets it)",
        param=param,
        code="context_length_exceeded",
    )


async def _whole(
    job: Job, events: asyncio.Queue, reply: Reply, request: Request, calls: ToolStream | None
) -> Response:
    """The answer in one body; a client that leaves first stops the generation."""

    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        job.cancel.set()

    watcher = asyncio.create_task(watch())
    text: list[str] = []
    entries: list[Entry] = []
    try:
        while True:
            event = await events.get()
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
                shown = _logprobs(reply, job, entries)
                body = reply.whole(answer, event.finish, usage(*event.usage), event.spec, shown)
                if found:
                    tooling.with_calls(body, found)
                return JSONResponse(body)
    finally:
        watcher.cancel()
        job.cancel.set()  # a no-op once the job is done


async def _stream(
    job: Job, events: asyncio.Queue, reply: Reply, req: GenRequest, calls: ToolStream | None
) -> AsyncIterator[str]:
    """Server-sent events: a role chunk (chat), text chunks with running stats, the finish
    chunk with the whole answer's stats, the usage chunk if asked for, then [DONE]. With
    tools, a call goes out as one `tool_calls` delta once the model has closed it."""
    try:
        if reply.chat:
            yield _sse(reply.chunk("", role=True))
        while True:
            event = await events.get()
            if isinstance(event, Delta):
                if calls is None:
                    shown = _logprobs(reply, job, event.logprobs)
                    yield _sse(reply.chunk(event.text, spec=event.spec, logprobs=shown))
                else:
                    for read in calls.push(event.text):
                        yield _sse(tooling.streamed(reply, read, event))
                continue
            if isinstance(event, Failed):  # the status line is sent: the error goes inline
                yield _sse(event.error.body())
            else:
                finish = event.finish
                if calls is not None:
                    for read in calls.flush():
                        yield _sse(tooling.streamed(reply, read, event))
                    finish = tooling.finish_reason(finish, calls.calls)
                yield _sse(reply.chunk(None, finish, spec=event.spec))
                if req.include_usage:
                    yield _sse(reply.usage_chunk(usage(*event.usage), event.spec))
            yield "data: [DONE]\n\n"
            return
    finally:
        job.cancel.set()  # the client left (or the stream ended): stop at the next step


def _logprobs(reply: Reply, job: Job, entries: list[Entry] | tuple[Entry, ...]) -> dict | None:
    """A choice's `logprobs` in the shape of its route (None when not asked for)."""
    if job.sampling.logprobs is None:
        return None
    return chat_logprobs(entries) if reply.chat else completion_logprobs(entries)


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class GuardedApp:
    """ASGI wrapper around the routes: the API key, counting requests by route and status,
    and a bug answered as a one-line 500 (the traceback only in the log, with --debug)."""

    def __init__(self, app: FastAPI, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        status = 500
        started = False

        async def sending(message: dict) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            if not self._allowed(scope, path):
                await error_response(UNAUTHORIZED)(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        except Exception as e:  # a bug in a route: the server answers and keeps serving
            if self.service.debug:
                traceback.print_exc()
            self.service.log.error(f"internal error: {type(e).__name__}: {e} (rerun with --debug)")
            if not started:
                bug = APIError(500, f"internal error: {type(e).__name__}", code="internal_error")
                await error_response(bug)(scope, receive, sending)
        finally:
            self.service.metrics.request(path, status)

    def _allowed(self, scope: dict, path: str) -> bool:
        key = self.service.api_key
        if key is None or path in OPEN_PATHS or path.startswith("/static/"):
            return True
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"authorization", b"").decode("latin-1")
        return given.startswith("Bearer ") and hmac.compare_digest(given[7:].strip(), key)
