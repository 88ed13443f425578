"""A GGUF file's tensors under the checkpoint names load plans use, kept packed.

The names come from models/formats/gguf/names.py, one table per architecture
(`blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`), so `loading.fill`
fills a GGUF target from the same plan rows as a safetensors one. Quantized tensors come
back as `PackedMatrix` (never dequantized), F32/F16/BF16 ones as tensors. The file is
read by models/formats/gguf/reader.py: its header and tensor index only, the tensors'
bytes when a plan row asks for them.

What llama.cpp's converter changed on the way (the `llama` architecture's permuted q/k
rows, Qwen3.5's reordered value heads, ...) is undone by models/formats/gguf/layouts.py, for a
block format always by reordering whole rows, or by gathering a matrix's input where the
reorder is of its columns: nothing is recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from specgen.core.config import ModelArgs
from specgen.core.errors import CheckpointError
from specgen.models.formats.gguf import layouts as gguf_layouts
from specgen.models.formats.gguf.blocks import BLOCK, DECODERS, packed_from_blocks
from specgen.models.formats.gguf.names import ARCHITECTURES, gguf_name, open_gguf, plan_names
from specgen.models.formats.gguf.reader import GGUFFile, TensorInfo
from specgen.models.formats.packed_matrix import PackedMatrix

DENSE = {"F32": np.float32, "F16": np.float16}
SUPPORTED = (*DENSE, "BF16", *DECODERS)


def gguf_architecture(path: Path) -> str | None:
    """The file's `general.architecture` (None if it names none)."""
    return GGUFFile(path).architecture


class GGUFIndex:
    """Checkpoint name -> GGUF tensor, for `loading.fill`."""

    def __init__(
        self, path: Path, name: str, args: ModelArgs, file: GGUFFile | None = None
    ) -> None:
        self.name, self.path, self.args = name, path, args
        self.file = file = file or open_gguf(path, name)
        self.arch = file.architecture or "?"
        if self.arch not in ARCHITECTURES:
            raise CheckpointError(f"{name}: the GGUF file names no architecture specgen reads")
        self.tensors = file.tensors
        self.where = plan_names(self.arch, self.tensors, args.num_layers)
        # the converter already applied what the family's finish_load does (Qwen3.5)
        self.finished = self.arch in gguf_layouts.FINISHED

    def label(self, key: str) -> str:
        """Plan key `key` as messages name it: the file's tensor (present or not) first."""
        return f"{self.where.get(key) or gguf_name(self.arch, key)} ({key})"

    def kinds(self) -> dict[str, int]:
        """How many tensors of each GGUF type the file holds."""
        counts: dict[str, int] = {}
        for t in self.tensors.values():
            counts[t.kind] = counts.get(t.kind, 0) + 1
        return counts

    def get(self, key: str, device: torch.device) -> PackedMatrix | torch.Tensor:
        t = self.tensors[self.where[key]]
        kind, shape = t.kind, t.shape
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
                out = packed_from_blocks(kind, self.file.data(t.name).reshape(rows, -1), rows, cols)
        except (ValueError, IndexError) as e:  # a short memmap: a truncated file
            raise CheckpointError(f"{self.name}: cannot read tensor {t.name} ({e})") from None
        out = gguf_layouts.undo(self.arch, key, out, self.args)
        return out.to(device)

    def _dense(self, t: TensorInfo, kind: str, shape) -> torch.Tensor:
        data = self.file.data(t.name)
        if kind == "BF16":  # stored as uint16 halves of fp32
            bits = data.view(np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = data.view(DENSE[kind]).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr).reshape(shape))
