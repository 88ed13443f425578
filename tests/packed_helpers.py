"""GGUF blocks and tiny GGUF targets for the packed-weight tests, written with the `gguf`
package in the layout llama.cpp's converter writes (tensor names from gguf's own name map,
q/k rows permuted for the `llama` architecture)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file, save_file

QUANTIZERS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize has these
ALL_KINDS = (*QUANTIZERS, "Q4_K", "Q5_K", "Q6_K")
ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
        "qwen3": gguf.MODEL_ARCH.QWEN3}  # fmt: skip
# where each format keeps its fp16 fields: (byte offset in the block, count)
# llama.cpp's own fallback for a K-quant tensor whose rows are not whole 256-blocks
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
HALVES = {"Q4_0": (0, 1), "Q4_1": (0, 2), "Q5_0": (0, 1), "Q5_1": (0, 2), "Q8_0": (0, 1),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1)}  # fmt: skip


def qtype(kind: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[kind]


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, *,
                  scale: float = 1e-3, halves: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Random bytes in `kind`'s layout [rows, bytes per row], every integer field uniform over
    its whole range; the fp16 scales drawn around `scale` (or given as `halves`)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype(kind)]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, count = HALVES[kind]
    if halves is None:
        halves = (rng.uniform(0.25, 1.0, (rows, cols // block, count)) * scale).astype(np.float16)
    data[..., at : at + 2 * count] = (
        halves.astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2 * count)
    )
    return data.reshape(rows, -1)


def dequantized(kind: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, qtype(kind))


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: rows (head, half, i) -> (head, i, half)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_tiny_gguf(hf_dir: Path, out: Path, kinds: dict[str, str], *, seed: int = 0) -> Path:
    """`hf_dir`'s tiny model as a GGUF file at `out`, each matrix in the kind of the first
    `kinds` key its GGUF name contains ("" matches all; norms stay F32). Returns a directory
    like `hf_dir` whose safetensors hold what the GGUF file defines (its dequantized
    weights): the dense oracle."""
    config = json.loads((hf_dir / "config.json").read_text())
    arch = config["model_type"]
    tensors = load_file(str(hf_dir / "model.safetensors"))
    names = gguf.get_tensor_name_map(ARCH[arch], config["num_hidden_layers"])
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCH[arch]])
    writer.add_block_count(config["num_hidden_layers"])
    oracle = {}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    for hf, t in tensors.items():
        base, _, suffix = hf.rpartition(".")
        gg = names.get_name(base)
        assert gg is not None, hf
        gg = f"{gg}.{suffix}"
        w = t.float().numpy()
        permuted = arch == "llama" and any(p in gg for p in (".attn_q.", ".attn_k."))
        if permuted:
            w = _permute(w, heads if ".attn_q." in gg else kv_heads)
        kind = next((k for pat, k in kinds.items() if pat in gg), None) if w.ndim == 2 else None
        if kind in K_FALLBACK and w.shape[1] % 256:
            kind = K_FALLBACK[kind]
        if kind is None:
            writer.add_tensor(gg, np.ascontiguousarray(w, dtype=np.float32))
            back = w
        else:
            if kind in QUANTIZERS:
                data = gguf.quants.quantize(w, qtype(kind))
            else:  # no K-quant quantizer in gguf: a random matrix in that layout
                data = random_blocks(kind, *w.shape, rng, scale=2e-4)
            writer.add_tensor(gg, data, raw_dtype=qtype(kind))
            back = dequantized(kind, data)
        if permuted:  # the dense oracle is in HF row order
            back = _unpermute(back, heads if ".attn_q." in gg else kv_heads)
        oracle[hf] = torch.from_numpy(np.ascontiguousarray(back, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dense = out.parent / f"{out.stem}-dequantized"
    dense.mkdir(exist_ok=True)
    for f in hf_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (dense / f.name).write_bytes(f.read_bytes())
    save_file(oracle, str(dense / "model.safetensors"))
    return dense


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
