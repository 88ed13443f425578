"""What the server's routes share (`Service`) and the statuses they agree on."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specgen.serve import limits
from specgen.serve.log import Log
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults
from specgen.serve.worker import Worker

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline

CLIENT_CLOSED = 499  # nginx's status for a request its client gave up (never sent: logged)


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
    body_timeout: float = limits.DEFAULT_BODY_TIMEOUT  # seconds to receive a request body
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
