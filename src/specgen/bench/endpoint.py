"""`specgen bench --endpoint URL`: the same prompts sent to any OpenAI-compatible server
(`specgen serve`, vLLM, SGLang, llama-server, ...), one streamed chat request at a time.

Per request: TTFT (from sending it to the first chunk with content), the answer's text,
its completion tokens (the final usage chunk: `stream_options.include_usage`) and the
speculative statistics the server reports (bench/stream.py reads the stream). The only
dependency is httpx.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx

from specgen.bench.stream import Answer, collect, error_text, short_text
from specgen.core.config import SamplingParams
from specgen.core.errors import SpecgenError

CONNECT_SECONDS = 10.0
READ_SECONDS = 300.0  # between two reads: a long prefill of a big model still fits
WARMUP_PROMPT = "Hello"


def base_url(url: str) -> str:
    """`url` without a trailing slash; a bare host gets `/v1` (every engine's prefix)."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SpecgenError(f"--endpoint {url}: give an http:// or https:// URL")
    path = parts.path.rstrip("/") or "/v1"
    return f"{parts.scheme}://{parts.netloc}{path}"


def default_name(url: str) -> str:
    """The endpoint's column: `endpoint:host:port`."""
    return "endpoint:" + urlsplit(url).netloc.rpartition("@")[2]


@dataclass(frozen=True)
class Endpoint:
    url: str  # the API's base, e.g. http://127.0.0.1:8000/v1
    name: str  # its column in the table
    model: str  # what each request's `model` says
    owned_by: str | None = None  # what /models says (vllm, sglang, llamacpp, specgen, ...)


class EndpointClient:
    """One OpenAI-compatible server: probed (GET /models, then a short warm-up chat)
    when opened, so a wrong URL, key or model fails before any local work."""

    def __init__(
        self,
        url: str,
        *,
        name: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        method: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = base_url(url)
        self.api_key = api_key or None
        # a method of a specgen server (its "specgen": {"method": ...} field; None: its own)
        self.method = method
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(READ_SECONDS, connect=CONNECT_SECONDS),
            transport=transport,
        )
        try:
            models = self._models()
            if model is None and not models:
                raise SpecgenError(f"{self.url}/models lists no model: give --endpoint-model")
            chosen = model or models[0][0]
            owner = dict(models).get(chosen) or (models[0][1] if models else None)
            self.endpoint = Endpoint(self.url, name or default_name(self.url), chosen, owner)
            self.chat(WARMUP_PROMPT, max_tokens=8, sampling=SamplingParams())  # warm-up
        except BaseException:
            self._http.close()
            raise

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EndpointClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _models(self) -> list[tuple[str, str | None]]:
        where = f"{self.url}/models"
        with _translated(where):
            response = self._http.get(where)
        self._check(response, where)
        try:
            body = response.json()
        except ValueError:
            body = None
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise SpecgenError(
                f'{where}: not an OpenAI-compatible API (expected {{"data": [...]}}, got '
                f"{short_text(response.text)})"
            )
        cards = [c for c in data if isinstance(c, dict) and isinstance(c.get("id"), str)]
        return [(c["id"], c.get("owned_by") if isinstance(c.get("owned_by"), str) else None)
                for c in cards]  # fmt: skip

    def chat(
        self,
        prompt: str | list[dict[str, str]],
        *,
        max_tokens: int,
        sampling: SamplingParams,
        think: bool | None = None,
    ) -> Answer:
        """One user message (or a conversation's messages), streamed, timed from the
        moment the request is sent."""
        where = f"{self.url}/chat/completions"
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if sampling.top_p < 1:
            body["top_p"] = sampling.top_p
        if sampling.top_k > 0:
            body["top_k"] = sampling.top_k  # not OpenAI's, but every local engine takes it
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if think is not None:  # vLLM's convention, which SGLang and llama-server share
            body["chat_template_kwargs"] = {"enable_thinking": think}
        if self.method is not None:
            body["specgen"] = {"method": self.method}
        with _translated(where):
            start = time.perf_counter()
            with self._http.stream("POST", where, json=body) as response:
                if response.status_code != 200:
                    response.read()
                self._check(response, where)
                kind = response.headers.get("content-type", "")
                if "text/event-stream" not in kind:
                    response.read()
                    raise SpecgenError(
                        f"{where}: answered a streamed request with {kind or 'no content type'}"
                        f", not server-sent events ({short_text(response.text)})"
                    )
                return collect(response.iter_bytes(), start=start, where=where)

    def _check(self, response: httpx.Response, where: str) -> None:
        if response.status_code == 200:
            return
        try:
            message = error_text(response.json())
        except ValueError:
            message = short_text(response.text, 120) if response.text.strip() else "no message"
        status = f"HTTP {response.status_code} {response.reason_phrase}".rstrip()
        hint = ""
        if response.status_code in (401, 403):
            hint = (
                " (the --api-key given was refused)"
                if self.api_key
                else " (give --api-key KEY or set OPENAI_API_KEY)"
            )
        raise SpecgenError(f"{where}: {status}: {message}{hint}")


@contextmanager
def _translated(where: str) -> Iterator[None]:
    """httpx's transport errors (refused, timed out, cut mid-stream) as one line naming
    the URL."""
    try:
        yield
    except httpx.ConnectError as e:
        raise SpecgenError(f"cannot reach {where}: {_reason(e)}") from None
    except httpx.TimeoutException as e:
        raise SpecgenError(f"{where}: no answer in time ({_reason(e)})") from None
    except httpx.HTTPError as e:
        raise SpecgenError(f"{where}: {type(e).__name__}: {_reason(e)}") from None


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__
