"""What `Run.load` asks of generate's fast start (api/quick.py): whether the options are
ones an image answers, the image's pipeline when there is one, and writing it after a
full load."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from specgen.core.config import AR, SpecConfig
from specgen.core.errors import SpecgenError

if TYPE_CHECKING:
    from specgen.api.quick import QuickPipeline
    from specgen.cli.options import Run
    from specgen.hub import ResolvedModel


def wanted(run: Run, spec: SpecConfig) -> bool:
    """Whether `run` asks for what an image answers (plain greedy decoding, packed, CPU)."""
    from specgen.api.quick import wants_quick

    return spec == SpecConfig(method=AR) and wants_quick(
        method=spec.method, drafter=spec.drafter, sampling=run.sampling(), device=run.device,
        dtype=run.dtype, quantize=run.quantize, dequantize=run.dequantize,
    )  # fmt: skip


def opened(run: Run, resolved: ResolvedModel) -> QuickPipeline | None:
    """The resolved model's fast start, when its image is there and covers the context."""
    from specgen.api.quick import open_quick
    from specgen.registry import MODELS

    if run.threads is not None and run.threads < 1:
        raise SpecgenError(f"--threads must be at least 1 (got {run.threads})")
    entry = MODELS.get(resolved.name)
    return open_quick(resolved, run.context, run.threads, entry.thinking if entry else None)


def write(pipe, gguf: Path) -> None:
    """The image the next run starts from (announced once, with its size)."""
    from specgen.api.quick import write_image
    from specgen.core.once import built
    from specgen.terminal import display

    began = time.perf_counter()
    try:
        written = write_image(pipe.model, gguf)
    except OSError as e:  # a full or read-only cache: this run answers all the same
        display.note(f"note: no fast-start image written ({e.strerror or e})")
        return
    if written is not None:
        path, size = written
        built(f"a fast-start image of {pipe.name} ({size / 2**20:.0f} MiB)",
              time.perf_counter() - began, path.parent)  # fmt: skip


def for_serving(run: Run, methods: list[str]) -> tuple[QuickPipeline | None, Path | None]:
    """What `serve` answers from while its pipelines load: the image's pipeline when plain
    greedy answers are among what it serves (AR is one of `methods`) and the options are
    ones an image answers, with the GGUF file the full load should write an image for
    when there is none yet. (None, None): the server starts as before."""
    from specgen.api.quick import GREEDY, wants_quick
    from specgen.hub import resolve_model
    from specgen.terminal import display

    spec = run.spec()
    served = methods or ([AR] if spec.is_ar and not spec.drafter else [])
    if AR not in served:
        return None, None
    if not wants_quick(
        method=AR, drafter=None, sampling=GREEDY, device=run.device, dtype=run.dtype,
        quantize=run.quantize, dequantize=run.dequantize,
    ):  # fmt: skip
        return None, None
    resolved = resolve_model(run.model, notify=None if run.quiet else display.status)
    if resolved.gguf is None:
        return None, None
    return opened(run, resolved), resolved.gguf
