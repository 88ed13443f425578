"""One packed matrix: integers in groups along the input dimension, w = scale_g * q + min_g.

Two storage kinds cover every format specgen loads (GGUF Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/
Q5_K/Q6_K, and `--quantize int4|int8`):

- 4 bits: `q` uint8 [N, K/2] in GGUF's Q4 order (per 32 columns, 16 bytes; column j < 16 is
  the low nibble of byte j, column j + 16 its high nibble), q in [0, 15];
- 8 bits: `q` int8 [N, K], one value per column;

with `scale` and `mins` [N, K/group] (`mins` None for symmetric formats), held as fp16
where every value is one exactly (GGUF's Q4_0/Q4_1/Q5_*/Q8_0 store them so; a K-quant's
products of two scales are not): the matrix then takes its file's bytes, and decoding,
which streams every weight once a token, reads 2 bytes a group less. Every
`scale * q` is exact in fp32 (a GGUF scale has at most 11 + 8 significant bits and q at most
6), so the matrix a file defines is `dequantize()`, rounded once per weight as the `gguf`
package rounds it, and the kernels' products differ from it by fp32 summation only.

A matrix may keep its columns in another order than the one it multiplies (`columns`):
llama.cpp stores Qwen3.5's `ssm_out` with its value heads reordered, a permutation that
crosses quantization blocks. The blocks stay as stored and the kernels gather the input
instead (stored column j multiplies input `columns[j]`); `dequantize` gives the matrix in
input order.
"""

from __future__ import annotations

import torch
from torch import nn

GROUPS_4BIT = (32, 64, 128, 256)  # what the kernels take: a multiple of the 32-column block
GROUPS_8BIT = (16, 32, 64, 128, 256)


class PackedMatrix(nn.Module):
    def __init__(
        self,
        q: torch.Tensor,
        scale: torch.Tensor,
        mins: torch.Tensor | None,
        *,
        bits: int,
        group: int,
        kind: str,  # where it came from, for reports: "Q4_1", "int4-g32", ...
        columns: torch.Tensor | None = None,  # [K] int64: the input each stored column takes
    ) -> None:
        super().__init__()
        self.bits, self.group, self.kind = bits, group, kind
        rows, packed_cols = q.shape
        cols = packed_cols * 2 if bits == 4 else packed_cols
        if bits not in (4, 8) or group not in (GROUPS_4BIT if bits == 4 else GROUPS_8BIT):
            raise ValueError(f"no kernel for {bits}-bit weights in groups of {group}")
        if cols % 32 or cols % group or scale.shape != (rows, cols // group):
            raise ValueError(
                f"packed {kind} matrix: bad shapes q {tuple(q.shape)}, scale {tuple(scale.shape)}"
            )
        scale, mins = _compact(scale, mins)
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scale", scale.contiguous())
        self.register_buffer("mins", None if mins is None else mins.contiguous())
        if columns is not None and tuple(columns.shape) != (cols,):
            raise ValueError(f"packed {kind} matrix: {columns.numel()} column indices for {cols}")
        self.register_buffer("columns", None if columns is None else columns.long().contiguous())
        self.shape = torch.Size((rows, cols))

    @property
    def device(self) -> torch.device:
        return self.q.device

    @property
    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size()
            for t in (self.q, self.scale, self.mins, self.columns)
            if t is not None
        )

    def integers(self, rows=None) -> torch.Tensor:  # [n, K] int16: q as stored (column order)
        q = self.q if rows is None else self.q[rows]
        if self.bits == 8:
            return q.to(torch.int16)
        blocks = q.view(q.shape[0], -1, 16).to(torch.int16)
        return torch.cat([blocks & 15, blocks >> 4], dim=-1).view(q.shape[0], -1)

    def dequantize(self, rows=None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The matrix (or `rows` of it: a slice or an index tensor) as the file defines it."""
        q = self.integers(rows).float()
        n, k = q.shape
        scale = (self.scale if rows is None else self.scale[rows]).float()
        w = q.view(n, k // self.group, self.group) * scale[..., None]
        if self.mins is not None:
            w = w + (self.mins if rows is None else self.mins[rows]).float()[..., None]
        w = w.view(n, k)
        if self.columns is not None:  # back in input order
            w = w[:, torch.argsort(self.columns)]
        return w.to(dtype)

    def narrow_rows(self, start: int, stop: int) -> PackedMatrix:
        """Rows [start, stop) sharing this matrix's storage."""
        mins = None if self.mins is None else self.mins[start:stop]
        return PackedMatrix(
            self.q[start:stop],
            self.scale[start:stop],
            mins,
            bits=self.bits,
            group=self.group,
            kind=self.kind,
            columns=self.columns,
        )

    def permute_rows(self, order: torch.Tensor) -> PackedMatrix:
        mins = None if self.mins is None else self.mins[order]
        return PackedMatrix(self.q[order], self.scale[order], mins, bits=self.bits,
                            group=self.group, kind=self.kind, columns=self.columns)  # fmt: skip

    def permute_columns(self, order: torch.Tensor) -> PackedMatrix:
        """The same storage multiplying its input as if its columns were reordered: the
        matrix whose column i is this one's column order[i] (nothing unpacked)."""
        stored = torch.arange(self.shape[1]) if self.columns is None else self.columns.cpu()
        columns = torch.argsort(order.cpu())[stored]
        return PackedMatrix(self.q, self.scale, self.mins, bits=self.bits, group=self.group,
                            kind=self.kind, columns=columns.to(self.q.device))  # fmt: skip

    def stacks_with(self, other: PackedMatrix) -> bool:
        """Whether the two can be one matrix, `other`'s rows below (a fused q/k/v)."""
        return (self.bits, self.group, self.mins is None, self.shape[1], self.kind) == (
            other.bits,
            other.group,
            other.mins is None,
            other.shape[1],
            other.kind,
        ) and _same(self.columns, other.columns)

    @staticmethod
    def stack(parts: list[PackedMatrix]) -> PackedMatrix:
        first = parts[0]
        # one dtype for all (fp16 where every part kept fp16, which then needs no check)
        half = all(p.scale.dtype == torch.float16 for p in parts)
        like = (lambda t: t) if half else (lambda t: t.float())  # noqa: E731
        mins = None if first.mins is None else torch.cat([like(p.mins) for p in parts])
        return PackedMatrix(
            torch.cat([p.q for p in parts]),
            torch.cat([like(p.scale) for p in parts]),
            mins,
            bits=first.bits,
            group=first.group,
            kind=first.kind,
            columns=first.columns,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., K] -> [..., N]
        from specgen.kernels.packed import packed_linear

        return packed_linear(x, self)


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))


def _compact(
    scale: torch.Tensor, mins: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Scales and minimums as fp16 when every one of them is exactly an fp16 value (given
    as fp16 already, as a GGUF block stores them, they are kept without a check), else fp32."""
    if scale.dtype == torch.float16 and (mins is None or mins.dtype == torch.float16):
        return scale, mins
    scale, mins = scale.float(), None if mins is None else mins.float()
    exact = lambda t: t is None or torch.equal(t.half().float(), t)  # noqa: E731
    if exact(scale) and exact(mins):
        return scale.half(), None if mins is None else mins.half()
    return scale, mins


def _round_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded to `bits` significant bits (kept fp32), so that scale * q stays exact."""
    mant, exp = torch.frexp(x)
    return torch.ldexp(torch.round(mant * 2**bits) / 2**bits, exp)


def quantize(w: torch.Tensor, bits: int, group: int) -> PackedMatrix:
    """A dense [N, K] matrix quantized group-wise along K, round to nearest: 8 bits symmetric
    (q in [-127, 127]), 4 bits with a minimum (q in [0, 15]). Scales keep 11 significant bits
    (fp16's), so each weight is one exact product plus, for 4 bits, one rounded sum."""
    w = w.detach().float()
    n, k = w.shape
    if k % group or k % 32:
        raise ValueError(f"{k} input columns do not split into groups of {group}")
    g = w.reshape(n, k // group, group)
    if bits == 8:
        amax = g.abs().amax(-1)
        scale = _round_mantissa(torch.where(amax > 0, amax / 127, torch.ones_like(amax)), 11)
        q = torch.round(g / scale[..., None]).clamp_(-127, 127).to(torch.int8).view(n, k)
        return PackedMatrix(q, scale, None, bits=8, group=group, kind=f"int8-g{group}")
    lo, hi = g.amin(-1), g.amax(-1)
    scale = _round_mantissa(torch.where(hi > lo, (hi - lo) / 15, torch.ones_like(lo)), 11)
    lo = _round_mantissa(lo, 11)  # as Q4_1 keeps its minimum: fp16's precision
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp_(0, 15).to(torch.uint8)
    blocks = q.view(n, k // 32, 2, 16)
    packed = (blocks[:, :, 0] | (blocks[:, :, 1] << 4)).reshape(n, k // 2)
    return PackedMatrix(packed, scale, lo, bits=4, group=group, kind=f"int4-g{group}")
