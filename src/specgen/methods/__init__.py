"""The drafter methods: one package each (its network where it has its own, its drafter,
training hooks and export hints), registered in `drafting.base.DRAFTERS` when imported.

Every package here is imported below, so adding a method is adding its package. Everything
above this layer (the API, training's CLI, export, the server) asks this registry, never
a method's name or class."""

from __future__ import annotations

import importlib
import pkgutil

from specgen.core.config import AR
from specgen.core.errors import SpecgenError
from specgen.drafting.base import DRAFTERS, DraftMethod

for _package in pkgutil.iter_modules(__path__):  # alphabetical: the order --help lists
    importlib.import_module(f"{__name__}.{_package.name}")

# What --method (and a request's method) accepts: plain decoding, then every drafter above.
METHODS = (AR, *DRAFTERS)


def method_class(name: str) -> type[DraftMethod]:
    """The registered method called `name` (a clear error for any other name)."""
    try:
        return DRAFTERS[name]
    except KeyError:
        raise SpecgenError(f"unknown method {name!r}; available: {', '.join(METHODS)}") from None


__all__ = ["DRAFTERS", "METHODS", "method_class"]
