"""Drafters. Importing this package registers every built-in method in `DRAFTERS`."""

from specgen.drafting import ngram  # noqa: F401  (registers "ngram")
from specgen.drafting.base import DRAFTERS, Draft, Drafter, register

__all__ = ["DRAFTERS", "Draft", "Drafter", "register"]
