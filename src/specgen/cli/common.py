"""What every command does around its real work: load the model, turn errors into one line."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer

from specgen.core.errors import SpecgenError
from specgen.terminal import display


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
    """transformers/huggingface_hub chatter (advisory warnings) is not for our users. Offline,
    huggingface_hub warns about every retry of a download (11 lines before our one-line
    error); its errors still reach us as exceptions, so its warnings go. Said through
    their environment variables, which they read when imported, so that a run which never
    needs transformers never imports it; a library already imported is told directly."""
    import os
    import sys

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.set_verbosity_error()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()
