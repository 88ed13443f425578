"""User-facing errors.

Anything a user can cause (a bad alias, a broken checkpoint, an empty prompt) raises
`SpecgenError` with a message that fits on one line and says what to do. The CLI prints
exactly that line and exits non-zero; everything else is a bug and gets a traceback with
`--debug`.
"""


class SpecgenError(Exception):
    """An error caused by input, environment or files, not by a bug in specgen."""

    exit_code = 2


class ModelNotFoundError(SpecgenError):
    """An alias, path or Hub repo that does not resolve to a model."""


class CheckpointError(SpecgenError):
    """A model directory or file that exists but cannot be loaded."""


class PromptError(SpecgenError):
    """A prompt that cannot be used: empty, not UTF-8, or longer than the context."""
