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


def pending_limit(features: torch.Tensor) -> int:
    """Tokens of these features' width that may wait unprojected (728 for the default's
    DFlash drafter: five tapped layers of 576 floats, a quarter of the target's own K/V per
    token)."""
    per_token = features.shape[-1] * features.element_size()
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
        self._pending: list[torch.Tensor] = []  # [1, T_i, F] each, in order
        self._pending_tokens = 0

    @property
    def length(self) -> int:
        """Committed tokens this context follows, projected or not."""
        return self.cache.length + self._pending_tokens

    def append(self, features: torch.Tensor) -> None:  # [1, T, F]
        self._pending.append(features)
        self._pending_tokens += features.shape[1]
        if self._pending_tokens >= pending_limit(features):
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
        features = torch.cat(self._pending, dim=1)[:, :keep]
        self._clear()
        if keep:
            self.append(features)

    def ready(self) -> StaticKVCache:
        """The cache with every committed token projected: what a draft attends to."""
        if self._pending:
            features = torch.cat(self._pending, dim=1)
            self._clear()
            self._extend(self.cache, features)
        return self.cache

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
