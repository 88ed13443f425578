"""The server's errors, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

One convention everywhere: input the server cannot use (bad JSON, a wrong type, a value it
cannot honour) is 400 `invalid_request_error`, naming the field in `param`; an unknown
model 404; a prompt (or prompt plus max_tokens) longer than the context 400
`context_length_exceeded`, as OpenAI answers; a body over the limit 413; a full queue 503
with `Retry-After`; a client gone 499 (logged and counted, never sent). Messages are one
line; tracebacks stay in the server's log.
"""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An answer other than 200, with what the client should read."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = " ".join(message.split())  # one line, whatever was passed
        self.param = param
        self.code = code
        self.kind = kind or ("server_error" if status >= 500 else "invalid_request_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 for a field the request got wrong."""
    return APIError(400, message, param=param, code=code)
