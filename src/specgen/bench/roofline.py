"""How close plain decoding runs to the memory-bandwidth roofline (CUDA).

A decoding step must read every weight once (the embedding table only for one row,
unless it doubles as the LM head) and the K/V of every cached token; at batch 1 that is
the whole cost, so bytes per step / step time / the GPU's peak bandwidth says how much
of the hardware AR uses. Peak bandwidths are the vendors' figures.
"""

from __future__ import annotations

from specgen.core.config import ModelArgs
from specgen.models.family import family_of
from specgen.models.transformer import Transformer

PEAK_GBPS = {  # substring of torch.cuda.get_device_name() -> GB/s (first match wins)
    "H200": 4800,
    "H100 PCIe": 2000,
    "H100": 3350,
    "A100-SXM4-80GB": 2039,
    "A100 80GB PCIe": 1935,
    "A100": 1555,
    "L40S": 864,
    "L4": 300,
    "RTX 4090": 1008,
    "RTX 3090": 936,
    "A10G": 600,
    "B200": 8000,
}


def peak_bandwidth(device_name: str) -> float | None:
    """Bytes per second for a GPU name, None when unknown."""
    for key, gbps in PEAK_GBPS.items():
        if key in device_name:
            return gbps * 1e9
    return None


def bytes_per_step(
    args: ModelArgs, weight_bytes: int, embed_bytes: int, kv_element_size: int, context: int
) -> int:
    """Bytes one decoding step reads: the weights as stored (the embedding table as one row
    unless it is also the LM head) plus what the family's cache holds for `context` cached
    tokens (K and V of its attention layers, a sliding layer's window only; a hybrid
    model's recurrent states)."""
    family = family_of(args)
    row = embed_bytes // args.vocab_size
    weights = weight_bytes - (0 if args.tie_word_embeddings else embed_bytes)
    kv = family.kv_bytes(args, context, kv_element_size)
    return weights + row + kv + family.state_bytes(args)


def model_bytes_per_step(model: Transformer, context: int) -> int:
    """`bytes_per_step` of a loaded target, its weights' bytes from the weight seam."""
    return bytes_per_step(
        model.args, model.resident_bytes, model.embed.nbytes, model.dtype.itemsize, context
    )


def utilisation(bytes_step: int, step_seconds: float, peak: float) -> float:
    return bytes_step / step_seconds / peak
