"""vLLM's tokenizer routes: `POST /tokenize`, `POST /detokenize`, `GET /tokenizer_info`.

Clients that count or send tokens themselves use them instead of loading the model's
tokenizer from the Hub: lm-eval's `local-completions` finds both `/tokenizer_info` and
`/tokenize` and then tokenizes through the server (its "remote" tokenizer), so a
loglikelihood task runs against `specgen serve` with nothing but a URL, offline. Shapes
are vLLM's: `{"prompt": str, "add_special_tokens": true}` or `{"messages": [...]}` ->
`{"count", "max_model_len", "tokens", "token_strs"}`; `{"tokens": [...]}` -> `{"prompt"}`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from specgen.core.errors import SpecgenError
from specgen.serve import limits
from specgen.serve.errors import invalid

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.serve.routing import Routes


def add_routes(app: Routes, pipe: Callable[[], Pipeline], service: Any) -> None:
    """The three routes on `app`, over the tokenizer of `pipe()` (the served model's)."""

    async def body_of(request: Request) -> dict:
        raw = await limits.read_body(request.headers, request.stream(), service.max_body_bytes)
        body = limits.parse_json(raw)
        if not isinstance(body, dict):
            raise invalid("the request body must be a JSON object", code="invalid_type")
        return body

    async def off_loop(work: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(service.encoder, work)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        target = pipe()
        ids = await off_loop(lambda: _tokenize(target, body))
        return {"count": len(ids), "max_model_len": target.context, "tokens": ids,
                "token_strs": None}  # fmt: skip

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await body_of(request)
        target = pipe()
        tokens = body.get("tokens")
        vocab = target.vocab_size
        if not isinstance(tokens, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens
        ):
            raise invalid("tokens must be an array of token ids", "tokens", "invalid_type")
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise invalid(f"tokens: token id {bad[0]} is not in [0, {vocab})", "tokens")
        text = await off_loop(lambda: target.codec.decode(tokens, skip_special=False))
        return {"prompt": text}

    @app.get("/tokenizer_info")
    async def tokenizer_info() -> dict[str, Any]:
        target = pipe()
        tok = target.codec.tokenizer
        return {
            "tokenizer_class": type(tok).__name__,
            "eos_token": tok.eos_token,
            "bos_token": tok.bos_token,
            "pad_token": tok.pad_token,
            "chat_template": getattr(tok, "chat_template", None),
            "model_max_length": target.context,
        }


def _tokenize(pipe: Pipeline, body: dict) -> list[int]:
    """A prompt's token ids as the completions route reads text, or messages' as the chat
    route renders them (its template, generation prompt opened)."""
    special = body.get("add_special_tokens", "messages" not in body)
    if not isinstance(special, bool):
        raise invalid("add_special_tokens must be a boolean", "add_special_tokens", "invalid_type")
    if "messages" in body:
        from specgen.serve.openai_api import parse_messages

        try:
            return pipe.encode(parse_messages(body))  # type: ignore[arg-type]
        except SpecgenError as e:
            raise invalid(str(e), "messages") from None
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise invalid("prompt must be a string (or give messages)", "prompt", "invalid_type")
    return pipe.codec.encode_raw(prompt, special=special)
