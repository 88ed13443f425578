"""The lazily extended drafter context: the same K/V as extending every step, whatever
the pattern of appends and rollbacks."""

from __future__ import annotations

import pytest
import torch

from specgen.drafting.context import PENDING_BYTES, DraftContext, pending_limit
from specgen.models.cache.kv import StaticKVCache


def _cache() -> StaticKVCache:
    return StaticKVCache(
        num_layers=1, batch=1, num_kv_heads=1, head_dim=4, capacity=256,
        dtype=torch.float32, device="cpu",
    )  # fmt: skip


def _extend(cache: StaticKVCache, features: torch.Tensor) -> None:
    """A per-token projection, like a drafter's: K = 2 * features, V = features + 1."""
    kv = features[:, None]  # [1, 1, T, 4]
    cache.write(0, 2 * kv, kv + 1)
    cache.commit(cache.length + features.shape[1])


@pytest.mark.parametrize("in_parts", [False, True], ids=["joined", "in-parts"])
def test_lazy_context_equals_eager_extension(in_parts: bool):
    gen = torch.Generator().manual_seed(0)
    eager, lazy = _cache(), DraftContext(_cache(), _extend)
    steps = [(5, None), (1, None), (3, 7), (2, None), (1, 9), (4, 3), (70, None), (1, 60)]
    steps.append((2, None))
    for tokens, rollback in steps:  # append T tokens, optionally roll back to a length
        features = torch.randn(1, tokens, 4, generator=gen)
        _extend(eager, features)
        # a drafter's tapped layers arrive apart and are joined along F when projected
        parts = (features[..., :1], features[..., 1:3], features[..., 3:])
        lazy.append(parts if in_parts else features)
        if rollback is not None:
            eager.rollback(rollback)
            lazy.rollback(rollback)
        assert lazy.length == eager.length
        assert lazy.cache.length <= eager.length  # some may still wait
        if tokens == 2:  # a draft: everything must be projected now
            assert lazy.ready().length == eager.length
    n = lazy.ready().length
    assert n == eager.length
    torch.testing.assert_close(lazy.cache.k[..., :n, :], eager.k[..., :n, :])
    torch.testing.assert_close(lazy.cache.v[..., :n, :], eager.v[..., :n, :])


def test_pending_features_are_bounded():
    lazy = DraftContext(_cache(), _extend)
    limit = pending_limit(torch.zeros(1, 1, 4))
    assert limit == PENDING_BYTES // 16  # the bound is in bytes
    assert limit > lazy.cache.capacity  # so a short answer never projects unasked
    wide = torch.zeros(1, 1, PENDING_BYTES // 4 // 100)
    big = DraftContext(
        StaticKVCache(num_layers=1, batch=1, num_kv_heads=1, head_dim=wide.shape[-1],
                      capacity=256, dtype=torch.float32, device="cpu"),
        lambda cache, f: (cache.write(0, f[:, None], f[:, None]),
                          cache.commit(cache.length + f.shape[1])),
    )  # fmt: skip
    for _ in range(pending_limit(wide)):
        assert big.cache.length == 0  # nothing projected before the bound
        big.append(wide)
    assert pending_limit(wide) == 100
    assert big.cache.length == 100  # projected without waiting for a draft
    assert big.length == 100
