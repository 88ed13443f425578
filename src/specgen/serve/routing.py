"""The routes' table: FastAPI's decorator style (`@routes.get(path)`, a handler taking
`request` and its path's parameters by name, a dict returned as JSON) over Starlette's
router, which is all of FastAPI the server used. FastAPI's import, with pydantic's, was a
fifth of a second of the server's start on two cores (benchmarks/cold_start.py)."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

Handler = Callable[..., Awaitable[Any]]


class Routes:
    def __init__(self) -> None:
        self.table: list[BaseRoute] = []

    def get(self, path: str) -> Callable[[Handler], Handler]:
        return self._add(path, "GET")

    def post(self, path: str) -> Callable[[Handler], Handler]:
        return self._add(path, "POST")

    def _add(self, path: str, method: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            names = set(inspect.signature(handler).parameters)

            async def endpoint(request: Request) -> Response:
                args = {k: v for k, v in request.path_params.items() if k in names}
                if "request" in names:
                    args["request"] = request
                out = await handler(**args)
                return out if isinstance(out, Response) else JSONResponse(out)

            self.table.append(Route(path, endpoint, methods=[method]))
            return handler

        return register
