"""The ngram method: registered as `--method ngram` by importing its drafter."""

from specgen.methods.ngram import drafter  # noqa: F401  (registers the method)
