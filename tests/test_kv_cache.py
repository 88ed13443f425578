"""The static cache at its edges: commit/rollback arithmetic and the capacity limit."""

from __future__ import annotations

import pytest
import torch

from specgen.models.cache.kv import ContextLimitError, StaticKVCache
from specgen.models.loading import load_target


def _cache(capacity=8):
    return StaticKVCache(
        num_layers=2,
        batch=1,
        num_kv_heads=2,
        head_dim=4,
        capacity=capacity,
        dtype=torch.float32,
        device="cpu",
    )


def _kv(t, value):
    return torch.full((1, 2, t, 4), float(value)), torch.full((1, 2, t, 4), -float(value))


def test_write_commit_rollback_and_overwrite():
    cache = _cache()
    keys, values = cache.write(0, *_kv(3, 1))
    assert keys.shape[2] == 3 and cache.length == 0  # written, not yet committed
    cache.commit(3)
    keys, _ = cache.write(0, *_kv(2, 2))
    assert keys.shape[2] == 5 and keys[0, 0, :, 0].tolist() == [1, 1, 1, 2, 2]
    cache.commit(5)
    cache.rollback(4)  # reject the last token: the next write lands on position 4
    keys, _ = cache.write(0, *_kv(1, 7))
    assert keys[0, 0, :, 0].tolist() == [1, 1, 1, 2, 7]
    cache.commit(5)
    assert cache.free == 3


def test_commit_only_what_was_written():
    cache = _cache()
    cache.write(0, *_kv(2, 1))
    with pytest.raises(ValueError):
        cache.commit(3)
    cache.commit(1)  # a partial commit is allowed (a verify keeping a prefix)
    with pytest.raises(ValueError):
        cache.commit(0)  # never backwards: that is rollback's job


def test_rollback_bounds():
    cache = _cache()
    cache.write(0, *_kv(4, 1))
    cache.commit(4)
    with pytest.raises(ValueError):
        cache.rollback(5)
    with pytest.raises(ValueError):
        cache.rollback(-1)
    cache.rollback(0)
    assert cache.length == 0
    with pytest.raises(ValueError):
        cache.commit(4)  # rolled-back positions cannot be re-committed without a write


def test_capacity_is_exact():
    cache = _cache(capacity=5)
    cache.write(0, *_kv(5, 1))  # exactly full is fine
    cache.commit(5)
    assert cache.free == 0
    cache.rollback(4)
    with pytest.raises(ContextLimitError):
        cache.write(0, *_kv(2, 1))
    cache.write(0, *_kv(1, 1))


def test_model_refuses_tokens_past_capacity_and_keeps_its_state(tiny_llama):
    model = load_target(tiny_llama, dtype=torch.float32, device="cpu")
    cache = model.new_cache(6)
    model(torch.arange(4).view(1, 4), cache)
    with pytest.raises(ContextLimitError):
        model(torch.arange(3).view(1, 3), cache)
    assert cache.length == 4
    model(torch.arange(2).view(1, 2), cache)
    assert cache.length == 6
