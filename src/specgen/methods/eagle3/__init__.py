"""The eagle3 method: registered as `--method eagle3` by importing its drafter."""

from specgen.methods.eagle3 import drafter  # noqa: F401  (registers the method)
