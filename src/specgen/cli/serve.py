"""`specgen serve`: the OpenAI-compatible HTTP API (specgen/serve/), with the same model
and method options as `generate`, loaded once at start."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from specgen.cli.common import user_errors
from specgen.cli.options import GROUPS, Run, run_options
from specgen.core import spin
from specgen.core.errors import SpecgenError
from specgen.terminal import display

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline
    from specgen.api.quick import QuickPipeline

EXAMPLES = """
Examples:

  specgen serve --port 8000

  specgen serve --model qwen3-8b --method dspark --api-key "$KEY"

  specgen serve --methods ar,dflash,dspark --port 0

  specgen serve --parallel 8 --queue-size 64
"""

DEFAULT = "Default for requests that do not set it"


@run_options(
    *GROUPS,
    without=("show_drafts",),  # no live view: answers go to clients
    helps={
        "method": "Decoding method; with --methods, the one requests get by default. "
        "Default: ar, or the kind of the --drafter given.",
        "drafter": "Drafter checkpoint instead of the registry's; with --methods, one per "
        "method, matched by its kind (a DFlash and a DSpark one for stacked).",
        "max_new_tokens": f"{DEFAULT} (max_tokens).",
        "temperature": f"{DEFAULT} (0 = greedy).",
        "top_p": f"{DEFAULT}.",
        "top_k": f"{DEFAULT} (0 = off).",
        "seed": f"{DEFAULT}.",
        "presence_penalty": f"{DEFAULT} (OpenAI's, -2 to 2; 0 = off).",
        "frequency_penalty": f"{DEFAULT} (OpenAI's, -2 to 2; 0 = off).",
        "repetition_penalty": f"{DEFAULT} (vLLM's: over prompt and answer; 1 = off).",
        "quiet": "No request log or status lines: only the ready line and errors.",
        "debug": "Log tracebacks of internal errors (clients still get one line).",
    },
)
def serve(
    methods: Annotated[
        list[str] | None,
        typer.Option(
            "--methods",
            help="Load several methods on the one target (comma-separated or repeated; "
            "weights are shared, each has its own KV cache); a request chooses with "
            '"specgen": {"method": NAME}.',
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (0.0.0.0: every interface).")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="Port to listen on; 0 picks a free one.")
    ] = 8000,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="SPECGEN_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every route but /health and the "
            "web page (or set SPECGEN_API_KEY).",
        ),
    ] = None,
    parallel: Annotated[
        int | None,
        typer.Option(
            "--parallel",
            help="Answers generated at once (slots), their steps batched; each slot holds a "
            "KV cache of the whole --context. Default: one per CPU core, 2 to 4.",
        ),
    ] = None,
    queue_size: Annotated[
        int,
        typer.Option(
            "--queue-size",
            help="Requests that may wait while every slot answers; beyond it, 503 + Retry-After.",
        ),
    ] = 16,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            "--max-body-bytes",
            help="Largest request body in bytes (default 8 MiB); a longer one is refused "
            "with 413 as soon as it passes the limit, before it is parsed.",
        ),
    ] = 8 * 1024 * 1024,
    shutdown_timeout: Annotated[
        float,
        typer.Option(
            "--shutdown-timeout",
            help="Seconds answers in flight and queued get to finish after Ctrl-C/SIGTERM; "
            "then they are cut and the server exits (within about 3 s more). A second "
            "Ctrl-C cuts them at once.",
        ),
    ] = 5.0,
    body_timeout: Annotated[
        float,
        typer.Option(
            "--body-timeout",
            help="Seconds a client may take to send its request body; then 408.",
        ),
    ] = 30.0,
    *,
    run: Run,
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API, with speculative stats per answer."""
    spin.for_serving()  # before torch loads: libgomp reads it once (core/spin.py)
    with user_errors(run.debug):
        from specgen.serve.log import Log
        from specgen.serve.openai_api import Defaults
        from specgen.serve.server import ServeConfig
        from specgen.serve.server import serve as run_server

        run.sampling()  # bad sampling options fail before anything loads
        defaults = Defaults(
            max_tokens=run.max_new_tokens, temperature=run.temperature, top_p=run.top_p,
            top_k=run.top_k, seed=run.seed, presence_penalty=run.presence_penalty,
            frequency_penalty=run.frequency_penalty, repetition_penalty=run.repetition_penalty,
            think=run.think,
        )  # fmt: skip
        config = ServeConfig(
            host=host, port=port, api_key=api_key, parallel=parallel, queue_size=queue_size,
            max_body_bytes=max_body_bytes,
            shutdown_timeout=shutdown_timeout, body_timeout=body_timeout,
            defaults=defaults, quiet=run.quiet,
            debug=run.debug, log=Log(display.write, display.status, display.error),
        )  # fmt: skip
        config.check()
        names = _names(methods, run)
        early, gguf = _early(run, names)
        run_server(_loader(run, names, write_image=gguf if early is None else None), config,
                   early=early, methods=names or [run.spec().method])  # fmt: skip


serve.__doc__ = (serve.__doc__ or "") + EXAMPLES


def _names(methods: list[str] | None, run: Run) -> list[str]:
    """The methods to load, the default first; empty: the one `--method` says."""
    from specgen.methods import METHODS

    names = [m.strip() for item in methods or [] for m in item.split(",") if m.strip()]
    if not names:
        return []
    unknown = [m for m in names if m not in METHODS]
    if unknown:
        raise SpecgenError(f"unknown method {unknown[0]!r}; available: {', '.join(METHODS)}")
    default = getattr(run.method, "value", run.method) or names[0]
    return list(dict.fromkeys([default, *names]))


def _early(run: Run, names: list[str]) -> tuple[QuickPipeline | None, Path | None]:
    """The fast start's pipeline that answers plain greedy requests while the pipelines
    load (cli/fast_start.py), and the GGUF file to write an image of when it has none."""
    from specgen.cli import fast_start
    from specgen.core import once

    once.listen(None if run.quiet else display.status)
    return fast_start.for_serving(run, names)


def _loader(
    run: Run, names: list[str], *, write_image: Path | None = None
) -> Callable[[], dict[str, Pipeline]]:
    """What the server's worker thread calls to load the pipelines (method -> pipeline):
    as `generate` loads one, or the first of `names` and the others on its weights
    (`specgen.api.method_pipelines.load_methods`); then the image of `write_image` (a GGUF
    file) the next start answers from at once."""

    def load() -> dict[str, Pipeline]:
        pipes = load_several() if names else load_one()
        if write_image is not None:
            from specgen.cli import fast_start

            fast_start.write(next(iter(pipes.values())), write_image)
        return pipes

    def load_one() -> dict[str, Pipeline]:
        pipe = run.load()
        return {pipe.spec.method: pipe}

    def load_several() -> dict[str, Pipeline]:
        from specgen.api.method_pipelines import drafters_by_kind, load_methods

        plain = replace(run, method=None)  # --method ar names the default, not "no drafter"
        return load_methods(
            names, run.load, settings=plain.spec(drafter=None),
            drafters=drafters_by_kind(run.drafters),
            notify=None if run.quiet else display.status, measure_costs=run.measure_costs,
        )  # fmt: skip

    return load
