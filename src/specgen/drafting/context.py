"""A block drafter's context (DFlash, DSpark): the K/V of committed tokens' target features,
extended lazily.

Every committed token's tapped target states must go through the drafter's context
projection (fc, norm, each layer's K/V) before the drafter can draft after it. Done per
step that is one small forward per step (the stacked pipeline pays it twice), wasted on
every step where the scheduler decides not to draft. So features wait here until a
draft needs them (`ready`) and are then projected in one batch. At most `MAX_PENDING`
tokens wait, which bounds the memory of a long run without drafts.

Projection is per token (no attention across the context), so batching changes nothing
but the floating-point order inside the matmuls. The device-resident loop does not wait:
it flushes what is pending (`ready`) and then writes every step's features itself at a
position held on the device (`write_at`), telling the context its length when the host
learns it (`assume`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specgen.models.cache.kv import StaticKVCache

PENDING_BYTES = 8 << 20  # features held back before they are projected anyway
MIN_PENDING = 64  # tokens, whatever their width


def pending_limit(features: torch.Tensor | tuple[torch.Tensor, ...]) -> int:
    """Tokens of these features' width (or their parts' together) that may wait
    unprojected (728 for the default's DFlash drafter: five tapped layers of 576 floats, a
    quarter of the target's own K/V per token)."""
    parts = features if isinstance(features, tuple) else (features,)
    per_token = sum(p.shape[-1] for p in parts) * parts[0].element_size()
    return max(MIN_PENDING, PENDING_BYTES // per_token)


class DraftContext:
    def __init__(
        self,
        cache: StaticKVCache,
        extend: Callable[[StaticKVCache, torch.Tensor], None],  # appends [1, T, F] features
        extend_at: Callable[[StaticKVCache, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> None:
        self.cache = cache
        self._extend = extend
        self._extend_at = extend_at  # writes features at a device-resident position
        self._pending: list[tuple[torch.Tensor, ...]] = []  # [1, T_i, F] in parts, in order
        self._pending_tokens = 0
        self._limit: int | None = None  # `pending_limit` of its features (one width)

    @property
    def length(self) -> int:
        """Committed tokens this context follows, projected or not."""
        return self.cache.length + self._pending_tokens

    def append(self, features: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        """Features [1, T, F] of T committed tokens, or their parts [1, T, F_i] (joined
        along F only when projected: most steps draft nothing, and a join per step was
        a twentieth of a learned drafter's overhead over a plain step)."""
        parts = features if isinstance(features, tuple) else (features,)
        self._pending.append(parts)
        self._pending_tokens += parts[0].shape[1]
        if self._limit is None:
            self._limit = pending_limit(parts)
        if self._pending_tokens >= self._limit:
            self.ready()

    def rollback(self, length: int) -> None:
        """Forget everything from position `length` on."""
        if length >= self.length:
            return
        if length < self.cache.length:
            self._clear()
            self.cache.rollback(length)
            return
        keep = length - self.cache.length  # some of the pending tokens stay
        features = self._joined()[:, :keep]
        self._clear()
        if keep:
            self.append(features)

    def ready(self) -> StaticKVCache:
        """The cache with every committed token projected: what a draft attends to."""
        if self._pending:
            features = self._joined()
            self._clear()
            self._extend(self.cache, features)
        return self.cache

    def _joined(self) -> torch.Tensor:  # [1, pending tokens, F]
        rows = [p[0] if len(p) == 1 else torch.cat(p, dim=-1) for p in self._pending]
        return rows[0] if len(rows) == 1 else torch.cat(rows, dim=1)

    def _clear(self) -> None:
        self._pending = []
        self._pending_tokens = 0

    # The device-resident loop (engine/resident.py) keeps the context length on the
    # device: it writes every verified position's features where they belong and tells the
    # host the true length only when it knows it.

    def write_at(self, features: torch.Tensor, start: torch.Tensor) -> None:
        """Project [1, T, F] features into positions [start, start + T) (start: [1] int64
        on the device); nothing becomes committed (see `assume`)."""
        assert self._extend_at is not None and not self._pending
        self._extend_at(self.cache, features, start)

    def assume(self, length: int) -> None:
        """The first `length` positions, written by `write_at`, are the committed ones."""
        assert not self._pending
        self.cache.assume_written(length)
