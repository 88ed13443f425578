"""What every command does around its real work: load the model, turn errors into one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from specgen import display
from specgen.config import SamplingParams, SpecConfig
from specgen.errors import SpecgenError


@contextmanager
def user_errors(debug: bool) -> Iterator[None]:
    """Errors become one line on stderr and a non-zero exit; `--debug` re-raises them."""
    try:
        yield
    except typer.Exit:
        raise
    except SpecgenError as e:
        if debug:
            raise
        display.error(str(e))
        raise typer.Exit(e.exit_code) from None
    except KeyboardInterrupt:
        display.error("interrupted")
        raise typer.Exit(130) from None
    except Exception as e:  # a bug: say so in one line, the traceback is one flag away
        if debug:
            raise
        display.error(f"internal error: {type(e).__name__}: {e} (rerun with --debug)")
        raise typer.Exit(1) from None


def quiet_libraries() -> None:
    """transformers/huggingface_hub chatter (advisory warnings) is not for our users."""
    import os

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging

    logging.set_verbosity_error()


def load_pipeline(
    model: str,
    *,
    spec: SpecConfig,
    device: str,
    dtype: str,
    context: int | None,
    quiet: bool,
):
    """Load the target (and drafter), reporting slow one-off work (conversion, downloads)."""
    quiet_libraries()
    from specgen.pipeline import Pipeline

    offload_torch(device)
    notify = None if quiet else display.status
    return Pipeline.load(
        model, device=device, dtype=dtype, context=context, spec=spec, notify=notify
    )


def offload_torch(device: str) -> None:
    """On the CPU, run all torch work in the compute thread from here on, so this (main)
    thread stays free for the live view and the overlap engine runs at full speed
    (`engine/compute.py`). Call before loading anything. On CUDA nothing changes."""
    from specgen.engine import compute
    from specgen.pipeline import resolve_device

    if resolve_device(device) == "cpu":
        compute.offload()


def sampling_options(
    max_new_tokens: int, temperature: float, top_k: int, top_p: float, seed: int | None
) -> SamplingParams:
    """Check the generation options before anything slow happens (loading a model)."""
    if max_new_tokens < 1:
        raise SpecgenError(f"--max-new-tokens must be at least 1 (got {max_new_tokens})")
    return SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
