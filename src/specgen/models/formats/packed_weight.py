"""Packed weights behind the weight seam: a LinearWeight made of `PackedMatrix` row segments.

A fused matrix (q/k/v, gate/up) is loaded from several checkpoint tensors that may be of
different kinds (a Q4_K_M file stores attn_v as Q6_K beside a Q4_K attn_q), so a weight is a
list of row segments; neighbours of the same kind are stacked into one segment as they load,
so the common case is a single kernel call. Dense segments (an F16 tensor in a GGUF) are
kept as they are.

Formats: `int4` and `int8` (`--quantize`, via `convert_weights`) quantize dense weights on
load; GGUF targets are built segment by segment by models/formats/gguf/index.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.kernels.packed import packed_linear
from specgen.models.formats.packed_matrix import PackedMatrix, quantize
from specgen.models.formats.weights import (
    DenseWeight,
    LinearWeight,
    register_format,
    storage_changed,
)

Segment = PackedMatrix | torch.Tensor  # a dense segment is a plain [rows, in] tensor


def _rows(seg: Segment) -> int:
    return seg.shape[0]


class PackedWeight(LinearWeight):
    """An [out, in] matrix stored as row segments; filled by `load` in any row order."""

    def __init__(self, rows: int, cols: int, *, dtype: torch.dtype, device: torch.device):
        super().__init__()
        self._shape = torch.Size((rows, cols))
        self._dtype, self._device = dtype, torch.device(device)
        self.segments = nn.ModuleList()  # PackedMatrix, or _Dense holding a tensor
        self.starts: list[int] = []

    # loading -------------------------------------------------------------------------
    def load(self, tensor: Segment, offset: int = 0) -> None:
        """Rows [offset, offset + len): a PackedMatrix as it is, or a dense tensor (which
        `quantize_dense` decides how to store: kept dense here)."""
        storage_changed()
        seg = tensor if isinstance(tensor, PackedMatrix) else self.quantize_dense(tensor)
        seg = seg.to(self._device) if isinstance(seg, PackedMatrix) else seg
        module = seg if isinstance(seg, PackedMatrix) else _Dense(seg.to(self._device, self._dtype))
        at = sum(1 for s in self.starts if s < offset)
        self.starts.insert(at, offset)
        self.segments.insert(at, module)
        self._merge()

    def quantize_dense(self, tensor: torch.Tensor) -> Segment:
        return tensor

    def _merge(self) -> None:
        i = 0
        while i + 1 < len(self.segments):
            a, b = self.segments[i], self.segments[i + 1]
            if (
                isinstance(a, PackedMatrix)
                and isinstance(b, PackedMatrix)
                and a.stacks_with(b)
                and self.starts[i] + _rows(a) == self.starts[i + 1]
            ):
                self.segments[i] = PackedMatrix.stack([a, b])
                del self.segments[i + 1]
                del self.starts[i + 1]
            else:
                i += 1

    # multiplying ---------------------------------------------------------------------
    def _parts(self, rows: slice | None):
        """(segment, its rows within `rows`) covering the requested output rows in order."""
        lo, hi = (0, self._shape[0]) if rows is None else rows.indices(self._shape[0])[:2]
        for start, seg in zip(self.starts, self.segments, strict=True):
            n = seg.shape[0]
            a, b = max(lo, start), min(hi, start + n)
            if a < b:
                yield seg if (a, b) == (start, start + n) else _narrow(seg, a - start, b - start)

    def forward(self, x: torch.Tensor, bias=None, rows: slice | None = None) -> torch.Tensor:
        if rows is None and len(self.starts) == 1:  # the usual call: one kernel, nothing else
            seg = self.segments[0]
            y = packed_linear(x, seg) if isinstance(seg, PackedMatrix) else seg(x)
            return y if bias is None else y + bias
        parts = list(self._parts(rows))
        ys = [p(x) for p in parts]
        y = ys[0] if len(ys) == 1 else torch.cat(ys, dim=-1)
        return y if bias is None else y + bias

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows by index, dequantized: an embedding (one row per token) or a trimmed head."""
        flat = ids.reshape(-1)
        if len(self.segments) == 1:  # the usual case, and no host sync (CUDA graphs)
            return self.segments[0].dequantize(flat, dtype=self._dtype).view(*ids.shape, -1)
        out = torch.empty(flat.numel(), self._shape[1], dtype=self._dtype, device=self._device)
        for start, seg in zip(self.starts, self.segments, strict=True):
            hit = ((flat >= start) & (flat < start + seg.shape[0])).nonzero().view(-1)
            if hit.numel():
                out[hit] = seg.dequantize(flat[hit] - start, dtype=self._dtype)
        return out.view(*ids.shape, self._shape[1])

    def dense(self) -> torch.Tensor:
        """The dequantized matrix (for training, checkpoints and oracles)."""
        return torch.cat([s.dequantize(dtype=self._dtype) for s in self.segments])

    @classmethod
    def from_dense(cls, weight: DenseWeight) -> PackedWeight:
        rows, cols = weight.shape
        made = cls(rows, cols, dtype=weight.dtype, device=weight.device)
        made.load(weight.weight.data)
        return made

    # what it holds -------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self._shape

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.segments)

    @property
    def kinds(self) -> list[str]:
        return sorted({s.kind for s in self.segments})

    @property
    def identity(self) -> str:
        return "packed-" + "-".join(self.kinds)

    def _apply(self, fn, recurse=True):  # .to(device) moves the segments and the record
        super()._apply(fn, recurse)
        if self.segments:
            self._device = next(iter(self.segments.buffers())).device
        return self


class _Dense(nn.Module):
    """A dense segment: kept at the weight's dtype, multiplied by F.linear."""

    kind = "dense"

    def __init__(self, w: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("w", w.contiguous())
        self.shape = w.shape

    @property
    def nbytes(self) -> int:
        return self.w.numel() * self.w.element_size()

    def dequantize(self, rows=None, dtype=None) -> torch.Tensor:
        w = self.w if rows is None else self.w[rows]
        return w if dtype is None else w.to(dtype)

    def narrow_rows(self, a: int, b: int) -> _Dense:
        return _Dense(self.w[a:b])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.w)


def _narrow(seg, a: int, b: int):
    return seg.narrow_rows(a, b)


def _quantized(bits: int, group: int):
    class Quantized(PackedWeight):
        def quantize_dense(self, tensor: torch.Tensor) -> Segment:
            # the largest group up to `group` that divides the row; a row that is not whole
            # 32-column blocks (no kernel for it) stays dense
            g, cols = group, tensor.shape[1]
            while g > 32 and cols % g:
                g //= 2
            return tensor if cols % g else quantize(tensor, bits, g)

    Quantized.__name__ = Quantized.__qualname__ = f"Int{bits}Weight"
    return Quantized


GROUP_INT8 = 32  # chosen by measurement: docs/results.md ("Quantizing on load")
GROUP_INT4 = 32
Int8Weight = register_format("int8")(_quantized(8, GROUP_INT8))
Int4Weight = register_format("int4")(_quantized(4, GROUP_INT4))
register_format("packed")(PackedWeight)
