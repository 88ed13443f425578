"""The drafter methods: one package each (its network where it has its own, its drafter,
training hooks and export hints), registered in `drafting.base.DRAFTERS` when its drafter
module is imported.

Every package here is a method, named as its package, so adding a method is adding its
package. `METHODS` (what `--method` accepts) is read from the package names alone, so a
command's `--help` or a bad option costs no torch; the first use of `DRAFTERS` (or
`method_class`) imports every package, which registers it. Everything above this layer
(the API, training's CLI, export, the server) asks this registry, never a method's name
or class."""

from __future__ import annotations

import importlib
import pkgutil
from typing import TYPE_CHECKING

from specgen.core.config import AR
from specgen.core.errors import SpecgenError

if TYPE_CHECKING:
    from specgen.drafting.base import DraftMethod

# alphabetical: the order --help lists them; each package registers the name it is called
NAMES = tuple(p.name for p in pkgutil.iter_modules(__path__) if p.ispkg)
# What --method (and a request's method) accepts: plain decoding, then every drafter.
METHODS = (AR, *NAMES)


def registered() -> dict[str, type[DraftMethod]]:
    """Every method, imported (and so registered) on first use: name -> class, in the
    order of `NAMES` whichever package happened to be imported first."""
    from specgen.drafting.base import DRAFTERS

    if list(DRAFTERS)[: len(NAMES)] != list(NAMES):
        for name in NAMES:
            importlib.import_module(f"{__name__}.{name}.drafter")
        others = {n: c for n, c in DRAFTERS.items() if n not in NAMES}  # registered elsewhere
        ordered = {n: DRAFTERS[n] for n in NAMES}
        DRAFTERS.clear()
        DRAFTERS.update({**ordered, **others})
    return DRAFTERS


def method_class(name: str) -> type[DraftMethod]:
    """The registered method called `name` (a clear error for any other name)."""
    try:
        return registered()[name]
    except KeyError:
        raise SpecgenError(f"unknown method {name!r}; available: {', '.join(METHODS)}") from None


def __getattr__(name: str):
    if name == "DRAFTERS":  # `from specgen.methods import DRAFTERS`: the full registry
        return registered()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DRAFTERS", "METHODS", "NAMES", "method_class", "registered"]
