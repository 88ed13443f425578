"""The dflash2 method: registered as `--method dflash2` by importing its drafter."""

from specgen.methods.dflash2 import drafter  # noqa: F401  (registers the method)
