"""The stacked method: registered as `--method stacked` by importing its drafter."""

from specgen.methods.stacked import drafter  # noqa: F401  (registers the method)
