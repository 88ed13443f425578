"""A request as the worker sees it (`Job`), and what it hands back: `Delta`s, then exactly
one end event, `Done` or `Failed` (serve/worker.py says when each is sent)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specgen.core.config import SamplingParams
from specgen.serve.errors import APIError
from specgen.serve.logprobs import Entry

if TYPE_CHECKING:
    from specgen.verify.constraint import Constraint

# the two ways a job ends early, as `Failed` (nothing was produced) and in `Done.cut`
CLIENT_GONE = "client"  # its client disconnected
SHUTDOWN = "shutdown"  # the server is stopping


@dataclass(frozen=True)
class Delta:
    text: str
    spec: dict[str, Any]  # report.running: drafted_chars, totals so far
    logprobs: tuple[Entry, ...] = ()  # the tokens whose text starts in this delta


@dataclass(frozen=True)
class Done:
    finish: str  # OpenAI's: stop or length (a cut answer says "length": it is cut short)
    usage: tuple[int, int, int]  # prompt, completion, cached prompt tokens
    spec: dict[str, Any]  # report.final (with "cut" when the answer was cut)
    cut: str | None = None  # CLIENT_GONE or SHUTDOWN: why it ended before its end


@dataclass(frozen=True)
class Failed:
    error: APIError


@dataclass(eq=False)
class Job:
    method: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stops: tuple[str, ...]
    post: Callable[[Delta | Done | Failed], None]  # called from the worker thread
    # a chunk's text and drafted characters, when the answer is read otherwise than the
    # pipeline decodes it (tool calls whose markers are special tokens: serve/tools.py)
    text_of: Callable[[Any], tuple[str, int]] | None = None
    ignore_eos: bool = False  # stop tokens do not end the answer (guidellm asks it)
    echo: bool = False  # the prompt's text (with sampling.logprobs, its logprobs) first
    constraint: Constraint | None = None  # what the answer may say (serve/grammar.py)
    cancel: threading.Event = field(default_factory=threading.Event)  # its client left
    queued_at: float = field(default_factory=time.perf_counter)
    ended: bool = False  # its end event was posted (set by the worker thread)


def client_gone() -> APIError:
    return APIError(499, "the client closed the request", code="client_closed")


def stopping() -> APIError:
    return APIError(
        503, "the server is stopping; the request was not answered (retry elsewhere or later)",
        code="shutting_down",
    )  # fmt: skip


class Overloaded(Exception):
    """The queue is full; `retry_after` seconds is when a place is expected to free up."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"retry after {retry_after} s")
        self.retry_after = retry_after
