"""Drafters. Importing this package registers every built-in method in `DRAFTERS`."""

from specgen.drafting import dflash, dspark, ngram, stacked  # noqa: F401  (registers methods)
from specgen.drafting.base import DRAFTERS, Checkpoint, Drafter, DraftMethod, method_of, register

__all__ = ["DRAFTERS", "Checkpoint", "DraftMethod", "Drafter", "method_of", "register"]
