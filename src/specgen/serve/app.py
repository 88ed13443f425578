"""The HTTP side: Starlette routes (serve/routing.py) that parse, queue a job for the
worker and stream its events back. Nothing here touches torch; tokenizing runs in a
thread of its own.

Streaming is Starlette's `StreamingResponse` writing `data: {json}\\n\\n` lines, rather than
sse-starlette or FastAPI's newer SSE support: the framing is one f-string, the class is
in every Starlette version the dependency range allows, and it cancels the body iterator
when the client disconnects, which is what stops the generation at its next step.
"""

from __future__ import annotations

import hmac
import json
import time
import traceback
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles

from specgen.serve import tools as tooling
from specgen.serve.errors import APIError
from specgen.serve.job import Delta, Failed, Job
from specgen.serve.jobs import Queued, collect, queue_job, read_json, sse_response
from specgen.serve.logprobs import Entry, chat_logprobs, completion_logprobs
from specgen.serve.openai_api import Reply, usage
from specgen.serve.responses import add_responses_route
from specgen.serve.routing import Routes
from specgen.serve.service import CLIENT_CLOSED, Service
from specgen.serve.tokenizing import add_routes as add_tokenizer_routes

__all__ = ["Service", "build_app", "error_response"]

STATIC = Path(__file__).resolve().parent / "static"  # the web view (index.html and assets)
OPEN_PATHS = ("/health", "/", "/favicon.ico")  # no API key needed (also /static/...)
UNAUTHORIZED = APIError(
    401,
    "a valid API key is required (Authorization: Bearer KEY)",
    code="invalid_api_key",
    headers={"WWW-Authenticate": "Bearer"},
)


async def _api_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, APIError)
    return error_response(e)


async def _gone(request: Request, e: Exception) -> Response:
    return Response(status_code=CLIENT_CLOSED)  # it left mid-body: not a 500


async def _bug(request: Request, e: Exception) -> Response:
    # answered here; GuardedApp, which sees it raised again, logs it
    return error_response(
        APIError(500, f"internal error: {type(e).__name__}", code="internal_error")
    )


async def _http_error(request: Request, e: Exception) -> Response:
    assert isinstance(e, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code)
    message = f"{request.method} {request.url.path}: {e.detail}"
    return error_response(APIError(e.status_code, message, code=code))


HANDLERS = {APIError: _api_error, ClientDisconnect: _gone, Exception: _bug,
            HTTPException: _http_error}  # fmt: skip


def build_app(service: Service) -> GuardedApp:
    app = Routes()

    @app.get("/health")
    async def health() -> JSONResponse:
        body = {
            "status": "stopping" if service.draining else "ok",
            "model": service.model,
            "methods": list(service.methods),
            "queued": service.worker.queued,
            "running": service.worker.running,
            "loading": service.worker.loading,  # early answers only (serve/early.py)
        }
        # 503 while draining: a balancer's health check takes the server out of rotation
        return JSONResponse(body, status_code=503 if service.draining else 200)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(service.metrics.render(), media_type="text/plain; version=0.0.4")

    def card() -> dict[str, Any]:
        pipe = service.pipes[service.methods[0]]
        return {
            "id": service.model,
            "object": "model",
            "created": service.started,
            "owned_by": "specgen",
            "max_model_len": pipe.context,
            "specgen": {"methods": list(service.methods), "aliases": sorted(service.names)},
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model:path}")
    async def model(model: str) -> dict[str, Any]:
        if model not in service.names:
            raise APIError(404, f"model {model!r} is not served here; this server runs "
                           f"{service.model!r}", param="model", code="model_not_found")  # fmt: skip
        return card()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await answer(service, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await answer(service, request, chat=False)

    add_responses_route(app, service)

    if (STATIC / "index.html").is_file():

        @app.get("/")
        async def page() -> FileResponse:
            return FileResponse(STATIC / "index.html")

    add_tokenizer_routes(app, lambda: service.pipes[service.methods[0]], service)
    if STATIC.is_dir():
        app.table.append(Mount("/static", StaticFiles(directory=STATIC), name="static"))
    starlette = Starlette(routes=app.table, exception_handlers=HANDLERS)  # type: ignore[arg-type]
    starlette.state.service = service
    return GuardedApp(starlette, service)


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def answer(service: Service, request: Request, *, chat: bool) -> Response:
    """Parse, tokenize, queue; then stream the job's events or wait for its end."""
    body = await read_json(service, request)
    queued = await queue_job(service, body, chat=chat)
    reply = Reply(("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24], int(time.time()),
                  service.model, chat)  # fmt: skip
    if queued.req.stream:
        return sse_response(_stream(queued, reply))
    whole = await collect(queued, request)
    if whole is None:
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; /metrics counts it
    shown = _logprobs(reply, queued.job, whole.entries)
    end = whole.end
    body = reply.whole(whole.text, end.finish, usage(*end.usage), end.spec, shown)
    if whole.calls:
        tooling.with_calls(body, whole.calls)
    return JSONResponse(body)


async def _stream(queued: Queued, reply: Reply) -> AsyncIterator[str]:
    """Server-sent events: a role chunk (chat), text chunks with running stats, the finish
    chunk with the whole answer's stats, the usage chunk if asked for, then [DONE]. With
    tools, a call goes out as one `tool_calls` delta once the model has closed it."""
    job, events, req, calls = queued.job, queued.events, queued.req, queued.calls
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

    def __init__(self, app: Starlette, service: Service) -> None:
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
        except ClientDisconnect:  # it left mid-body: nobody to answer, and not a bug
            status = CLIENT_CLOSED if not started else status
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
