"""The draft method: registered as `--method draft` by importing its drafter."""

from specgen.methods.draft import drafter  # noqa: F401  (registers the method)
