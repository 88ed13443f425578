"""Static KV cache: allocated once, addressed by an explicit length.

Every layer's keys and values live in one buffer of `capacity` positions. A forward pass
writes its new tokens at [length, length + T) and the model then `commit`s them; the
speculative loop `rollback`s to the committed length after a verify pass. Nothing is ever
reallocated or copied on rollback: positions past `length` are simply dead and are
overwritten by the next write.
"""

from __future__ import annotations

import torch

from specgen.errors import PromptError


class ContextLimitError(PromptError):
    """A write that would run past the cache capacity (the context limit)."""


class StaticKVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        batch: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        shape = (num_layers, batch, num_kv_heads, capacity, head_dim)
        # empty, not zeros: positions >= length are never read, and untouched pages of a
        # large context are not even faulted in on the CPU.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0  # positions [0, length) hold committed tokens
        self._written = 0  # end of the last write; commit may not go past it
        self._finite = False  # every position past `length` holds a finite value

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
        self.k[slot, :, :, start:end] = k
        self.v[slot, :, :, start:end] = v
        self._written = end
        return self.k[slot, :, :, :end], self.v[slot, :, :, :end]

    def stepped(self) -> None:
        """After each static (graph-capturable) step, outside any graph: nothing to do
        here (a hybrid cache moves its recurrent state on)."""

    def slot(self, layer: int) -> int:
        """Where `layer`'s keys and values live (a hybrid cache holds attention layers only)."""
        return layer

    def tensors(self) -> list[torch.Tensor]:
        """The buffers it keeps (for memory figures)."""
        return [self.k, self.v]

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
            self.k[:, :, :, self.length :].zero_()
            self.v[:, :, :, self.length :].zero_()
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
        self.k = self.k[:, rows].contiguous()
        self.v = self.v[:, rows].contiguous()

    def reset(self) -> None:
        self.rollback(0)

    @property
    def free(self) -> int:
        return self.capacity - self.length
