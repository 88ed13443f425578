"""What every drafter method builds on: the protocols and the registry (`base`), a block
drafter's context, loader and fixed-shape step, draft vocabularies. The methods themselves
live in `specgen.methods`, which registers them."""

from specgen.drafting.base import (
    DRAFTERS,
    Checkpoint,
    Drafter,
    DraftMethod,
    checkpoint_free,
    method_of,
    register,
)

__all__ = [
    "DRAFTERS",
    "Checkpoint",
    "DraftMethod",
    "Drafter",
    "checkpoint_free",
    "method_of",
    "register",
]
