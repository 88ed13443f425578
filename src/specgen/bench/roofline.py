"""How close plain decoding runs to the memory-bandwidth roofline (CUDA).

A decoding step must read every weight once (the embedding table only for one row,
unless it doubles as the LM head) and the K/V of every cached token; at batch 1 that is
the whole cost, so bytes per step / step time / the GPU's peak bandwidth says how much
of the hardware AR uses. Peak bandwidths are the vendors' figures.
"""

from __future__ import annotations

from specgen.config import LINEAR, ModelArgs

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


def bytes_per_step(args: ModelArgs, parameter_bytes: int, element_size: int, context: int) -> int:
    """Bytes one decoding step reads: the weights (the embedding table as one row unless
    it is also the LM head) plus K and V of `context` cached tokens in the attention
    layers (of a sliding-window layer's window), and a hybrid model's recurrent states
    (fp32; read, and written back once)."""
    embedding = args.vocab_size * args.hidden_size * element_size
    weights = parameter_bytes - (0 if args.tie_word_embeddings else embedding)
    hy, g = args.hybrid, args.gemma
    attention = args.num_layers if hy is None else args.num_layers - hy.layer_types.count(LINEAR)
    kv = 2 * attention * args.num_kv_heads * args.head_dim * element_size * context
    if g is not None:  # per layer: its shape, and a sliding layer reads its window only
        kv = sum(
            2 * g.kv_heads[i] * g.head_dims[i] * element_size
            * min(context, g.window(i) or context)
            for i in range(args.num_layers)
        )  # fmt: skip
    states = 0
    if hy is not None:
        per_state = hy.value_heads * hy.key_dim * hy.value_dim * 4
        states = 2 * hy.layer_types.count(LINEAR) * per_state
    return weights + args.hidden_size * element_size + kv + states


def utilisation(bytes_step: int, step_seconds: float, peak: float) -> float:
    return bytes_step / step_seconds / peak
