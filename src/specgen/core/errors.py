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


class OptionError(SpecgenError):
    """An option's value outside its range (the one rule, checked in the library).

    The message names it as the command line does (`--top-p`); a caller that calls it
    otherwise (the server's `top_p`, `max_tokens`) says the same rule with `said_as`."""

    def __init__(self, option: str, rule: str, value: object) -> None:
        self.option, self.rule, self.value = option, rule, value
        super().__init__(self.said_as("--" + option.replace("_", "-")))

    def said_as(self, name: str) -> str:
        return f"{name} {self.rule} (got {self.value})"


class Cancelled(Exception):
    """An answer stopped on purpose before it finished (its caller asked, between two
    prefill chunks). Not an error of input: the server ends the request quietly."""
