"""The dspark method: registered as `--method dspark` by importing its drafter."""

from specgen.methods.dspark import drafter  # noqa: F401  (registers the method)
