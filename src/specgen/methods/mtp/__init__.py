"""The mtp method: registered as `--method mtp` by importing its drafter."""

from specgen.methods.mtp import drafter  # noqa: F401  (registers the method)
