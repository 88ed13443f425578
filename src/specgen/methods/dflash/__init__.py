"""The dflash method: registered as `--method dflash` by importing its drafter."""

from specgen.methods.dflash import drafter  # noqa: F401  (registers the method)
