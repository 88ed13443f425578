"""`specgen export`: print the vLLM or SGLang launch command for the same target + drafter."""

from __future__ import annotations

from typing import Annotated

import typer

from specgen.cli.common import user_errors
from specgen.cli.options import DebugOpt, ModelOpt, Run
from specgen.terminal import display


def export(
    method: Annotated[
        str, typer.Option("--method", help="dflash, dflash2, draft, dspark, eagle3 or mtp.")
    ],
    engine: Annotated[str, typer.Option("--engine", help="vllm or sglang.")],
    model: ModelOpt = Run.model,
    drafter: Annotated[
        str | None,
        typer.Option("--drafter", help="Drafter repo or directory (default: the registry's)."),
    ] = None,
    block_size: Annotated[
        int | None,
        typer.Option("--block-size", help="The drafter's block or chain (default: its config)."),
    ] = None,
    tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel GPUs.")] = 1,
    port: Annotated[int, typer.Option("--port", help="Port to serve on.")] = 8000,
    debug: DebugOpt = Run.debug,
) -> None:
    """Print the command that serves this model and drafter on vLLM or SGLang (and, on
    stderr, the `specgen bench --endpoint` line that measures it)."""
    with user_errors(debug):
        from specgen.bench.suites import BUILTIN
        from specgen.core.errors import SpecgenError
        from specgen.export import bench_command, launch_command, notes, resolve_target

        if tp < 1 or not 0 < port < 65536:
            raise SpecgenError("--tp must be >= 1 and --port in 1..65535")
        serve = resolve_target(model, method, drafter, block_size)
        command = launch_command(engine, serve, tp=tp, port=port)
        display.write(command + "\n")  # stdout: the launch line alone, runnable as it is
        for line in notes(engine, serve):
            display.note(f"note: {line}")
        display.note(f"measure it: {bench_command(serve, port=port, suite=BUILTIN)}")
        if engine == "vllm":  # its per-answer statistics are opt-in
            display.note(
                "note: for τ per answer, add vLLM's --per-request-spec-decode-metrics summary "
                "(recent vLLM) to the launch line"
            )
