"""Compute kernels. Each module holds `<op>_torch` (the reference), the Triton kernel, and a
wrapper that dispatches on the backend chosen once per process:

    SPECGEN_KERNELS=torch|triton   (default: triton when CUDA and Triton are available)

Triton kernels are tested on the CPU with TRITON_INTERPRET=1 against their references.
"""

from __future__ import annotations

import functools
import importlib.util
import os

from specgen.core.errors import SpecgenError

BACKENDS = ("torch", "triton")


@functools.cache
def backend() -> str:
    """The kernel backend for this process (read once)."""
    choice = os.environ.get("SPECGEN_KERNELS", "auto").strip().lower()
    if choice not in ("auto", *BACKENDS):
        raise SpecgenError(f"SPECGEN_KERNELS must be torch, triton or auto (got {choice!r})")
    if choice != "auto":
        if choice == "triton" and not triton_available():
            raise SpecgenError("SPECGEN_KERNELS=triton but Triton is not installed")
        return choice
    import torch

    return "triton" if torch.cuda.is_available() and triton_available() else "torch"


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


@functools.cache
def triton_wanted() -> bool:
    """Whether this process defines the Triton kernels: Triton is installed and there is
    something to run them on (a GPU, or Triton's interpreter in the tests). A CPU run never
    calls them, and importing Triton cost a cold start half a second."""
    if not triton_available():
        return False
    if os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get("SPECGEN_KERNELS") == "triton":
        return True
    import torch

    return torch.cuda.is_available()
