"""`serve`: bind the port, load the pipelines in the worker thread, run uvicorn until a
signal, and leave cleanly.

Stopping, in a bounded time whatever the clients do (`docker stop` waits 10 s before it
kills): the first Ctrl-C or SIGTERM makes the server drain. New answers get 503
`shutting_down` and `/health` says "stopping" (the listener stays open so that a
balancer can see it), while the answers in flight and queued finish for up to
`shutdown_timeout` seconds (default 5). Then the running one is cut at its next step or
prefill chunk (a stream still gets its finish chunk and `data: [DONE]`; `specgen.cut`
says why) and the queued ones get 503; at most `CUT_WAIT` seconds later the listener
closes and connections get `CLOSE_WAIT` seconds to take their answers. A second signal
does all of it at once. The exit status is 0: stopping on a signal is how a server ends.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import uvicorn

from specgen.core.errors import SpecgenError
from specgen.registry import MODELS
from specgen.serve.app import Service, build_app
from specgen.serve.limits import DEFAULT_MAX_BODY_BYTES
from specgen.serve.log import Log
from specgen.serve.metrics import Metrics
from specgen.serve.openai_api import Defaults
from specgen.serve.worker import Worker

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline

MAX_PARALLEL = 256
CUT_WAIT = 2.0  # seconds a cut answer gets to reach its next step or prefill chunk
CLOSE_WAIT = 1.0  # seconds open connections get to take their last bytes once drained


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 8000  # 0: a free port, printed in the ready line
    api_key: str | None = None
    parallel: int | None = None  # answers at once (slots); None: from the machine
    queue_size: int = 16  # requests that may wait while the slots are busy
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES  # a longer request body is a 413
    shutdown_timeout: float = 5.0  # seconds answers in flight get after the first signal
    body_timeout: float = 30.0  # seconds a client may take to send its request body
    defaults: Defaults = Defaults()
    quiet: bool = False  # no request log or status lines
    debug: bool = False  # tracebacks in the log
    log: Log = Log()  # the ready line, status lines, internal errors (the CLI's: Rich)

    def check(self) -> None:
        """Bad values fail before the model loads."""
        if not 0 <= self.port <= 65535:
            raise SpecgenError(f"--port must be in [0, 65535] (got {self.port})")
        if self.parallel is not None and not 1 <= self.parallel <= MAX_PARALLEL:
            raise SpecgenError(f"--parallel must be in [1, {MAX_PARALLEL}] (got {self.parallel})")
        if self.queue_size < 1:
            raise SpecgenError(f"--queue-size must be at least 1 (got {self.queue_size})")
        if self.max_body_bytes < 1:
            raise SpecgenError(f"--max-body-bytes must be at least 1 (got {self.max_body_bytes})")
        if self.shutdown_timeout < 0:
            raise SpecgenError(f"--shutdown-timeout must be >= 0 (got {self.shutdown_timeout})")
        if not self.body_timeout > 0:
            raise SpecgenError(f"--body-timeout must be > 0 (got {self.body_timeout})")
        if self.api_key is not None and not self.api_key.strip():
            raise SpecgenError("--api-key is empty")


def serve(
    load: Callable[[], dict[str, Pipeline]], config: ServeConfig, *, early: Any = None,
    methods: Sequence[str] = (),
) -> None:  # fmt: skip
    """Serve the pipelines `load()` returns (method -> pipeline, the first the default)
    until a signal. `load` runs in the worker thread, which then owns all torch work.
    `early` (api/quick.QuickPipeline): the server is ready at once, answering plain greedy
    AR requests from it while `load` runs (serve/early.py); `methods` are then the ones
    `load` returns, the default first. A load that fails then stops the server with its
    error."""
    config.check()
    sock = _listen(config.host, config.port)  # before the slow part: a busy port fails now
    parallel = config.parallel or default_parallel()
    worker = Worker(
        load, queue_size=config.queue_size, parallel=parallel, debug=config.debug, log=config.log,
        early=early, methods=methods,
    )  # fmt: skip
    try:
        pipes = worker.start()
        base = next(iter(pipes.values()))
        metrics = Metrics(tuple(pipes))
        metrics.queued = lambda: worker.queued
        metrics.running = lambda: worker.running
        metrics.parallel = parallel
        metrics.slots = worker.slots
        metrics.batch = lambda: worker.streams.counters if worker.streams else None
        worker.metrics = metrics
        model = served_id(base.name)
        service = Service(
            worker, model, frozenset(model_names(base.name)), config.defaults, metrics,
            api_key=config.api_key, debug=config.debug, log=config.log,
            max_body_bytes=config.max_body_bytes, body_timeout=config.body_timeout,
        )  # fmt: skip
        host, port = sock.getsockname()[:2]
        where = f"[{host}]" if ":" in host else host
        slots = f"{parallel} slot" + ("" if parallel == 1 else "s")
        ready = f"serving {model} ({', '.join(pipes)}, {slots}) on http://{where}:{port}/v1"
        uv = uvicorn.Config(
            build_app(service),
            lifespan="off",
            log_config=_log_config(config.quiet),
            timeout_graceful_shutdown=CLOSE_WAIT,  # after the drain (_Server.drain)
        )
        server = _Server(uv, worker, service, ready, config)
        worker.on_failure = lambda e: setattr(server, "should_exit", True)
        if worker.load_error is not None:  # failed before the server was made
            raise worker.load_error
        server.run(sockets=[sock])
        if worker.load_error is not None:
            raise worker.load_error
    finally:
        worker.close(timeout=CUT_WAIT)  # a thread stuck in a forward is a daemon: not waited
        sock.close()


def default_parallel() -> int:
    """Slots when --parallel is not given: one per CPU core up to 4 (more answers than
    cores share each step's products, but every answer's own work, its drafting and
    sampling, waits its turn), at least 2 so a short request never waits behind a long
    one. Each slot holds a KV cache of the whole --context."""
    return max(2, min(4, os.cpu_count() or 1))


def served_id(name: str) -> str:
    """The model id clients see: the alias or repo, or a local checkpoint's own name."""
    path = Path(name)
    if path.exists():
        return path.stem if path.suffix == ".gguf" else path.resolve().name
    return name


def model_names(name: str) -> set[str]:
    """What a request's `model` may say: the served id, the name as given, the alias's
    Hub repo (or the alias of a repo given by name)."""
    names = {name, served_id(name)}
    for entry in MODELS.values():
        if name.lower() in (entry.alias, entry.repo.lower()):
            names |= {entry.alias, entry.repo}
    return names


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=128)
    except OSError as e:
        raise SpecgenError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    sock.set_inheritable(True)
    return sock


def _log_config(quiet: bool) -> dict:
    """uvicorn's logging with its start-up chatter off (the ready line says it all) and,
    unless quiet, one access line per request."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["loggers"]["uvicorn"]["level"] = "WARNING"
    cfg["loggers"]["uvicorn.error"]["level"] = "WARNING"
    cfg["loggers"]["uvicorn.access"]["level"] = "WARNING" if quiet else "INFO"
    return cfg


class _Server(uvicorn.Server):
    """uvicorn's Server with specgen's ready line and stopping rules."""

    def __init__(
        self, config: uvicorn.Config, worker: Worker, service: Service, ready: str,
        opts: ServeConfig,
    ) -> None:  # fmt: skip
        super().__init__(config)
        self.worker, self.service, self.ready, self.opts = worker, service, ready, opts
        self.signals = 0

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.opts.log.write(self.ready + "\n")
        self.worker.go()  # early answers: the load begins now (a no-op otherwise)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # uvicorn's own closes the listener at once and raises the signal again once it has
        # shut down (exit 130 or 143); here the server drains first and exits 0
        self.signals += 1
        if self.signals == 1:
            self.service.draining = True
            busy = self.worker.queued + self.worker.running
            if busy and not self.opts.quiet:
                answers = f"{busy} answer" + ("" if busy == 1 else "s")
                self.opts.log.status(
                    f"stopping: {answers} in flight get "
                    f"{self.opts.shutdown_timeout:g} s to finish (Ctrl-C again cuts them)"
                )
            threading.Thread(target=self.drain, name="specgen-drain", daemon=True).start()
        else:  # cut now: the answers end at their next step, the listener closes
            self.worker.cut_all()
            self.should_exit = True
            if self.signals > 2:
                self.force_exit = True

    def drain(self) -> None:
        """Wait for the worker to finish (at most the grace), cut what is left, wait for
        the cut (at most CUT_WAIT), then let uvicorn close."""
        if not _wait(lambda: self.worker.idle or self.should_exit, self.opts.shutdown_timeout):
            self.worker.cut_all()
            _wait(lambda: self.worker.idle, CUT_WAIT)
        time.sleep(0.05)  # the handlers' last events reach the event loop
        self.should_exit = True


def _wait(done, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True
