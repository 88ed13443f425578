"""Which device and dtype a pipeline runs on, from what the user asked for."""

from __future__ import annotations

import torch

from specgen.core.errors import SpecgenError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecgenError(f"--device {device}: this torch build sees no CUDA GPU")
    if device != "cpu" and not device.startswith("cuda"):
        raise SpecgenError(f"--device must be auto, cpu or cuda[:N] (got {device!r})")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        # bf16 halves the bytes a GPU step reads; on CPUs without bf16 matmul units it is
        # slower than fp32 (benchmarks/ar_vs_transformers.py measures both).
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise SpecgenError(f"--dtype must be one of auto, {', '.join(DTYPES)} (got {dtype!r})")
    return DTYPES[dtype]
