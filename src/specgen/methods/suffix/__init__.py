"""The suffix method: registered as `--method suffix` by importing its drafter."""

from specgen.methods.suffix import drafter  # noqa: F401  (registers the method)
