"""A GGUF file's tensors under the checkpoint names load plans use, kept packed.

The names come from the `gguf` package's own tensor-name map for the file's architecture
(`blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`), so `loading.fill` fills
a GGUF target from the same plan rows as a safetensors one. Quantized tensors come back as
`PackedMatrix` (never dequantized), F32/F16/BF16 ones as tensors.

llama.cpp's converter permutes the rows of q and k for the `llama` architecture (its RoPE
pairs neighbours, HF's pairs halves); the rows are put back in HF order here, which for a
row-wise block format is a reordering of whole rows, nothing recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specgen.errors import CheckpointError
from specgen.models.gguf_blocks import BLOCK, DECODERS, packed_from_blocks
from specgen.models.packed import PackedMatrix

DENSE = {"F32": np.float32, "F16": np.float16}
SUPPORTED = (*DENSE, "BF16", *DECODERS)
ROPE_PERMUTED = ("llama",)  # architectures whose q/k rows llama.cpp's converter permuted


def _open(path: Path, name: str):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # a truncated or foreign file fails in numpy's memmap or struct
        raise CheckpointError(
            f"{name}: not a readable GGUF file ({type(e).__name__}: {e})"
        ) from None


class GGUFIndex:
    """Checkpoint name -> GGUF tensor, for `loading.fill`."""

    def __init__(self, path: Path, name: str, config: dict) -> None:
        import gguf

        self.name, self.path = name, path
        self.reader = reader = _open(path, name)
        arch_field = reader.get_field("general.architecture")
        self.arch = str(arch_field.contents()) if arch_field is not None else "?"
        self.tensors = {t.name: t for t in reader.tensors}
        self.heads = config.get("num_attention_heads")
        self.kv_heads = config.get("num_key_value_heads") or self.heads
        by_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
        if self.arch not in by_arch:
            raise CheckpointError(f"{name}: GGUF architecture {self.arch!r} is not one gguf knows")
        blocks = config.get("num_hidden_layers") or 0
        names = gguf.get_tensor_name_map(by_arch[self.arch], blocks)
        gguf_to_hf: dict[str, list[str]] = {}
        for hf, (_, gg) in names.mapping.items():
            gguf_to_hf.setdefault(gg, []).append(hf)
        self.where: dict[str, str] = {}
        for full in self.tensors:
            base, dot, suffix = full.rpartition(".")
            for hf in gguf_to_hf.get(base, ()):
                self.where[f"{hf}{dot}{suffix}"] = full

    def kinds(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
        return counts

    def get(self, key: str, device: torch.device) -> PackedMatrix | torch.Tensor:
        t = self.tensors[self.where[key]]
        kind = t.tensor_type.name
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # ggml lists ne0 first
        if kind not in SUPPORTED:
            raise CheckpointError(
                f"{self.name}: tensor {t.name} is {kind}, which specgen cannot run packed "
                f"(supported: {', '.join(SUPPORTED)}; --dequantize loads any type)"
            )
        try:
            if kind in DENSE or kind == "BF16":
                out = self._dense(t, kind, shape)
            else:
                rows, cols = shape if len(shape) == 2 else (1, shape[0])
                if cols % BLOCK[kind]:
                    raise CheckpointError(
                        f"{self.name}: {t.name} has {cols} columns, not whole {kind} blocks"
                    )
                out = packed_from_blocks(kind, t.data.reshape(rows, -1), rows, cols)
        except (ValueError, IndexError) as e:  # a short memmap: a truncated file
            raise CheckpointError(f"{self.name}: cannot read tensor {t.name} ({e})") from None
        out = self._unpermute(t.name, out)
        return out.to(device)

    def _dense(self, t, kind: str, shape) -> torch.Tensor:
        data = np.asarray(t.data)
        if kind == "BF16":  # stored as uint16 halves of fp32
            bits = data.view(np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = data.view(DENSE[kind]).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr).reshape(shape))

    def _unpermute(self, gguf_name: str, m):
        if self.arch not in ROPE_PERMUTED or not self.heads:
            return m
        heads = {".attn_q.": self.heads, ".attn_k.": self.kv_heads}
        n = next((h for tag, h in heads.items() if tag in gguf_name), None)
        if n is None:
            return m
        rows = m.shape[0]
        order = torch.arange(rows).view(n, rows // n // 2, 2).transpose(1, 2).reshape(rows)
        return m.permute_rows(order) if isinstance(m, PackedMatrix) else m[order]
