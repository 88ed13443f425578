"""What one request may cost before the worker sees it: the body's size, read as it
streams in (never more than the limit plus one chunk), its JSON's nesting and sizes, and
a prompt that cannot fit the context, told apart before the whole of it is tokenized.

Each bound answers in OpenAI's error shape: 413 for a body or a prompt too large, 400
for a shape no request needs (a body nested 10 000 deep would otherwise reach Python's
recursion limit somewhere, a 500).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from specgen.serve.errors import APIError, invalid

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024  # a 262k-token prompt as text or token ids fits
DEFAULT_BODY_TIMEOUT = 30.0  # seconds to receive a body (8 MiB at 2 Mbit/s takes 32)
MAX_DEPTH = 64  # objects and arrays; a tool's JSON Schema nests a dozen at most
MAX_ITEMS = 1 << 20  # per array or object: a token-id prompt of the longest context fits


def body_too_large(limit: int, size: int | None = None) -> APIError:
    said = f"{size} bytes" if size is not None else f"over {limit} bytes"
    return APIError(
        413,
        f"the request body is {said}; this server takes at most {limit} "
        "(its --max-body-bytes sets it)",
        code="request_too_large",
    )


async def read_body_within(
    headers: dict[str, str], chunks: AsyncIterator[bytes], limit: int, timeout: float
) -> bytes:
    """`read_body`, or a 408 when the whole body has not come within `timeout` seconds
    (a client that sends its headers and then nothing would hold a handler forever)."""
    try:
        return await asyncio.wait_for(read_body(headers, chunks, limit), timeout)
    except asyncio.TimeoutError:
        raise APIError(
            408, f"the request body did not arrive within {timeout:g} s (the server's "
            "--body-timeout)", code="request_timeout",
        ) from None  # fmt: skip


async def read_body(headers: dict[str, str], chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The body, refused as soon as it is known to pass `limit`: from Content-Length
    before a byte is read, else while it streams (chunked uploads send no length)."""
    declared = headers.get("content-length")
    if declared is not None and declared.strip().isdigit() and int(declared) > limit:
        raise body_too_large(limit, int(declared))
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        parts.append(chunk)
    return b"".join(parts)


def parse_json(body: bytes) -> Any:
    """The body as JSON, within MAX_DEPTH and MAX_ITEMS, or a 400 saying why not."""
    try:
        value = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise invalid(f"the body is not valid JSON ({e})", code="invalid_json") from None
    except RecursionError:  # the C decoder's own guard, far deeper than MAX_DEPTH
        raise _too_deep() from None
    check_shape(value)
    return value


def check_shape(value: Any) -> None:
    """Iteratively (a recursive walk is what the bound protects against). Strings must
    be text: JSON's `\\ud800` escapes decode to lone surrogates, which no tokenizer takes."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, str):
            _text(node)
        if not isinstance(node, dict | list):
            continue
        if depth > MAX_DEPTH:
            raise _too_deep()
        if len(node) > MAX_ITEMS:
            kind = "an object" if isinstance(node, dict) else "an array"
            raise invalid(
                f"the body has {kind} of {len(node)} items; at most {MAX_ITEMS}",
                code="too_many_items",
            )
        if isinstance(node, dict):
            for key in node:
                _text(key)
        items = node.values() if isinstance(node, dict) else node
        stack.extend((item, depth + 1) for item in items if isinstance(item, dict | list | str))


def _text(s: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = f"\\u{ord(s[e.start]):04x}"
        raise invalid(
            f"the body has a string with a lone surrogate ({bad}), which is not text",
            code="invalid_json",
        ) from None


def _too_deep() -> APIError:
    return invalid(f"the body nests objects and arrays more than {MAX_DEPTH} deep", code="too_deep")


# --- a prompt against the context, before tokenizing all of it ---------------------------

SAMPLE_PER_TOKEN = 8  # characters sampled per token of context: most text is ~4 a token
MARGIN = 64  # tokens a cut word may add to a sample's count


def longest_token_chars(tokenizer: Any) -> int:
    """An upper bound on the characters one token decodes to (n characters are then at
    least n / this many tokens): the longest vocabulary entry. Byte-level entries spell
    one character per byte, so they never undercount."""
    try:
        return max(1, max(len(piece) for piece in tokenizer.get_vocab()))
    except Exception:  # a tokenizer without a vocabulary: no bound from it
        return 1 << 30


def certainly_too_long(text: str, context: int, longest: int, count: Any) -> int | None:
    """A lower bound on `text`'s tokens that proves it leaves no room in `context`, or
    None. `count(s)` tokenizes `s`; it only ever sees a bounded sample of `text`."""
    if len(text) // longest >= context:
        return len(text) // longest
    sample_chars = context * SAMPLE_PER_TOKEN
    if len(text) <= sample_chars:
        return None  # short enough to tokenize whole
    cut = text.rfind(" ", 0, sample_chars)
    sample = text[: cut if cut > sample_chars // 2 else sample_chars]
    tokens = count(sample) - MARGIN
    return tokens if tokens >= context else None
