"""Drafters. Importing this package registers every built-in method in `DRAFTERS`."""

from specgen.drafting import dflash, dflash2, dspark, eagle3, ngram, stacked  # noqa: F401  (registers methods)
from specgen.drafting.base import DRAFTERS, Checkpoint, Drafter, DraftMethod, method_of, register
from specgen.types.config import AR

# What --method (and a request's method) accepts: plain decoding, then every drafter above.
METHODS = (AR, *DRAFTERS)

__all__ = ["DRAFTERS", "METHODS", "Checkpoint", "DraftMethod", "Drafter", "method_of", "register"]
