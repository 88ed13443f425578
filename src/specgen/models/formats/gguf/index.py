"""A GGUF file's tensors under the checkpoint names load plans use, kept packed.

The names come from the `gguf` package's own tensor-name map for the file's architecture
(`blk.3.attn_q.weight` is `model.layers.3.self_attn.q_proj.weight`), so `loading.fill` fills
a GGUF target from the same plan rows as a safetensors one. Quantized tensors come back as
`PackedMatrix` (never dequantized), F32/F16/BF16 ones as tensors.

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
from specgen.models.formats.packed_matrix import PackedMatrix

DENSE = {"F32": np.float32, "F16": np.float16}
SUPPORTED = (*DENSE, "BF16", *DECODERS)


def open_gguf(path: Path, name: str):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # a truncated or foreign file fails in numpy's memmap or struct
        raise CheckpointError(
            f"{name}: not a readable GGUF file ({type(e).__name__}: {e})"
        ) from None


def gguf_architecture(path: Path) -> str | None:
    """The file's `general.architecture` (None if it names none)."""
    field = open_gguf(path, str(path)).get_field("general.architecture")
    return None if field is None else str(field.contents())


class GGUFIndex:
    """Checkpoint name -> GGUF tensor, for `loading.fill`."""

    def __init__(self, path: Path, name: str, args: ModelArgs) -> None:
        import gguf

        self.name, self.path, self.args = name, path, args
        self.reader = reader = open_gguf(path, name)
        field = reader.get_field("general.architecture")
        self.arch = str(field.contents()) if field is not None else "?"
        self.tensors = {t.name: t for t in reader.tensors}
        by_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}
        if self.arch not in by_arch:
            raise CheckpointError(f"{name}: GGUF architecture {self.arch!r} is not one gguf knows")
        # layers past num_layers (a Qwen3.5 file's multi-token-prediction block) stay unnamed
        self.names = gguf.get_tensor_name_map(by_arch[self.arch], args.num_layers)
        gguf_to_hf: dict[str, list[str]] = {}
        for hf, (_, gg) in self.names.mapping.items():
            gguf_to_hf.setdefault(gg, []).append(hf)
        self.where: dict[str, str] = {}
        for full in self.tensors:
            base, dot, suffix = full.rpartition(".")
            # `blk.3.ssm_a` has no suffix; every other tensor a `.weight` or `.bias`
            for stem, end in ((full, ""), (base, dot + suffix)) if dot else ((full, ""),):
                for hf in gguf_to_hf.get(stem, ()):
                    self.where[gguf_layouts.plan_key(self.arch, hf + end)] = full
        # the converter already applied what the family's finish_load does (Qwen3.5)
        self.finished = self.arch in gguf_layouts.FINISHED

    def label(self, key: str) -> str:
        """Plan key `key` as messages name it: the file's tensor (present or not) first."""
        return f"{self._gguf_name(key)} ({key})"

    def _gguf_name(self, key: str) -> str:
        if key in self.where:
            return self.where[key]
        for end in ("", ".weight", ".bias"):
            for hf, (_, gg) in self.names.mapping.items():
                if gguf_layouts.plan_key(self.arch, hf + end) == key:
                    return gg + end
        return "?"

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
        out = gguf_layouts.undo(self.arch, key, out, self.args)
        return out.to(device)

    def _dense(self, t, kind: str, shape) -> torch.Tensor:
        data = np.asarray(t.data)
        if kind == "BF16":  # stored as uint16 halves of fp32
            bits = data.view(np.uint16).astype(np.uint32) << 16
            arr = bits.view(np.float32)
        else:
            arr = data.view(DENSE[kind]).astype(np.float32)
        return torch.from_numpy(np.ascontiguousarray(arr).reshape(shape))
