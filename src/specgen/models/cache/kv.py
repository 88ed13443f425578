"""Static KV cache: allocated once, addressed by an explicit length.

Every layer's keys and values live in one buffer of `capacity` positions. A forward pass
writes its new tokens at [length, length + T) and the model then `commit`s them; the
speculative loop `rollback`s to the committed length after a verify pass. Nothing is ever
reallocated or copied on rollback: positions past `length` are simply dead and are
overwritten by the next write.

Layers live in slots (`slot(layer)`): one per layer by default; several layers may read one
slot (Gemma 4's KV sharing), and slots may differ in KV heads and head dim (Gemma 4's
sliding and global layers). Slots of one shape share a buffer [n, B, n_kv, capacity, d];
with one shape `k`/`v` are that buffer, with several a tuple of per-slot views, so
`k[slot]` is a slot's [B, n_kv, capacity, d] either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specgen.core.errors import ContextLimitError


def widened(keys: torch.Tensor, values: torch.Tensor, dtype: torch.dtype):
    """Keys and values as `dtype` for the eager layers' arithmetic: a cache kept narrower
    (a fused CPU target's fp16, models/fused/cpu_pass.kv_dtype) is widened exactly."""
    if keys.dtype == dtype:
        return keys, values
    return keys.to(dtype), values.to(dtype)


class StaticKVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        num_kv_heads: int | Sequence[int],  # one for every slot, or one per slot
        head_dim: int | Sequence[int],  # one for every slot, or one per slot
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
        slots: Sequence[int] | None = None,  # layer -> slot; default: layer i in slot i
    ) -> None:
        heads = [num_kv_heads] * num_layers if isinstance(num_kv_heads, int) else num_kv_heads
        dims = [head_dim] * num_layers if isinstance(head_dim, int) else head_dim
        self.shapes = [(int(h), int(d)) for h, d in zip(heads, dims, strict=True)]  # per slot
        self._slot_of = None if slots is None else tuple(slots)
        # slots of one shape share a buffer: shape -> [n, B, n_kv, capacity, d] for k and v
        groups = list(dict.fromkeys(self.shapes))
        self._where = [
            (groups.index(s), self.shapes[:i].count(s)) for i, s in enumerate(self.shapes)
        ]
        # empty, not zeros: positions >= length are never read, and untouched pages of a
        # large context are not even faulted in on the CPU.
        sizes = [(self.shapes.count(s), batch, s[0], capacity, s[1]) for s in groups]
        self._k = [torch.empty(size, dtype=dtype, device=device) for size in sizes]
        self._v = [torch.empty(size, dtype=dtype, device=device) for size in sizes]
        self._views()
        self.capacity = capacity
        self.length = 0  # positions [0, length) hold committed tokens
        self._written = 0  # end of the last write; commit may not go past it
        self._finite = False  # every position past `length` holds a finite value

    def _views(self) -> None:
        """`k`/`v`: the one buffer, or a tuple of each slot's [B, n_kv, capacity, d] view."""
        if len(self._k) == 1:
            self.k, self.v = self._k[0], self._v[0]
            return
        self.k = tuple(self._k[g][j] for g, j in self._where)
        self.v = tuple(self._v[g][j] for g, j in self._where)

    def write(
        self,
        layer: int,
        k: torch.Tensor,  # [B, n_kv, T, d]
        v: torch.Tensor,  # [B, n_kv, T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' K/V after `length`; return views of [0, length + T)."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.capacity:
            raise ContextLimitError(
                f"context limit reached: {end} tokens do not fit in {self.capacity}"
            )
        slot = self.slot(layer)
        self.k[slot][:, :, start:end] = k  # rounded to nearest even where the cache is fp16
        self.v[slot][:, :, start:end] = v
        self._written = end
        return widened(self.k[slot][:, :, :end], self.v[slot][:, :, :end], k.dtype)

    def written(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of `layer`'s slot up to the end of the last write, [B, n_kv, L, d] each: a
        layer that reuses an earlier layer's K/V (written in this same forward) reads them."""
        slot = self.slot(layer)
        return self.k[slot][:, :, : self._written], self.v[slot][:, :, : self._written]

    def begin(self, tokens: int, *, prefill: bool, pad: torch.Tensor | None = None) -> None:
        """Before an eager forward of `tokens` tokens: nothing for attention alone (a cache
        that keeps recurrent state sets up where its layers read and write)."""

    def begin_static(self, positions: torch.Tensor) -> None:  # [T] int64 on the device
        """`begin` for a graph-capturable step whose position lives on the device."""

    def stepped(self) -> None:
        """After each static (graph-capturable) step, outside any graph: nothing to do
        here (a hybrid cache moves its recurrent state on)."""

    def slot(self, layer: int) -> int:
        """Where `layer`'s keys and values live (a hybrid cache holds attention layers only;
        layers sharing K/V share a slot)."""
        return layer if self._slot_of is None else self._slot_of[layer]

    def tensors(self) -> list[torch.Tensor]:
        """The buffers it keeps (for memory figures)."""
        return [*self._k, *self._v]

    def restorable(self, length: int) -> int:
        """The longest length <= `length` it can roll back to: any, for keys and values."""
        return min(length, self.length)

    def reserve(self, tokens: int) -> int:
        """Claim [length, length + tokens) for a write through `write_at` (whose positions
        live on the device); returns the start. The caller commits as after `write`."""
        start, end = self.length, self.length + tokens
        if end > self.capacity:
            raise ContextLimitError(
                f"context limit reached: {end} tokens do not fit in {self.capacity}"
            )
        self._written = end
        return start

    def write_at(
        self,
        layer: int,
        positions: torch.Tensor,  # [T] int64 on the device, inside a `reserve`d range
        k: torch.Tensor,  # [B, n_kv, T, d]
        v: torch.Tensor,  # [B, n_kv, T, d]
    ) -> None:
        """Store K/V at positions held in device memory (no host value: graph-capturable)."""
        self.k[self.slot(layer)].index_copy_(2, positions, k)
        self.v[self.slot(layer)].index_copy_(2, positions, v)

    def make_finite(self) -> None:
        """Zero every position never written. The masked (graph-capturable) attention
        weighs positions past the length by 0, and 0 * NaN from `empty` memory is NaN;
        written positions are finite, so this is needed once per cache."""
        if not self._finite:
            for buffer in (*self._k, *self._v):
                buffer[:, :, :, self.length :].zero_()
            self._finite = True

    def assume_written(self, length: int) -> None:
        """Positions [0, length) were written through `write_at` by steps whose lengths
        lived on the device (engine/resident.py); make them the committed ones."""
        if not 0 <= length <= self.capacity:
            raise ValueError(f"assume_written({length}) outside [0, {self.capacity}]")
        self.length = self._written = length

    def commit(self, length: int) -> None:
        """Make the first `length` positions valid; they must have been written."""
        if not self.length <= length <= self._written:
            raise ValueError(f"commit({length}) outside [{self.length}, {self._written}]")
        self.length = length

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on (0 <= length <= current length)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback({length}) outside [0, {self.length}]")
        self.length = length
        self._written = length

    def keep_rows(self, rows: torch.Tensor) -> None:
        """Keep only these batch rows (batched generation drops finished answers)."""
        self._k = [k[:, rows].contiguous() for k in self._k]
        self._v = [v[:, rows].contiguous() for v in self._v]
        self._views()

    def reset(self) -> None:
        self.rollback(0)

    @property
    def free(self) -> int:
        return self.capacity - self.length
