"""The Markov-head kernel (greedy and sampled) against its torch reference, and the
reference against the drafter's own left-to-right draw."""

from __future__ import annotations

import pytest
import torch

from specgen.kernels import triton_available
from specgen.kernels.markov import markov_greedy_torch

pytestmark = pytest.mark.skipif(not triton_available(), reason="Triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _case(k, vocab, sub, rank, hidden, conf, with_markov, seed):
    gen = torch.Generator().manual_seed(seed)
    ids = None if sub is None else torch.randperm(vocab, generator=gen)[:sub].sort().values
    cols = vocab if sub is None else sub
    t = {
        "base": torch.randn(k, cols, generator=gen) * 2,
        "hidden": torch.randn(k, hidden, generator=gen),
        "w1": torch.randn(vocab, rank, generator=gen),
        "w2": torch.randn(cols, rank, generator=gen) * 0.5,
        "ids": ids,
        "conf_w": torch.randn(1, hidden + (rank if with_markov else 0), generator=gen)
        if conf
        else None,
        "conf_b": torch.randn(1, generator=gen) if conf else None,
    }
    return {n: None if v is None else v.to(DEVICE) for n, v in t.items()}


@pytest.mark.parametrize(
    "k, vocab, sub, rank, hidden, conf, with_markov",
    [
        (7, 300, None, 8, 48, True, True),
        (8, 1000, 257, 16, 64, True, False),
        (1, 50, None, 4, 16, False, False),
        (5, 5000, 700, 64, 100, True, True),
    ],
)
def test_kernel_matches_the_reference(k, vocab, sub, rank, hidden, conf, with_markov):
    from specgen.kernels.markov import markov_greedy_triton

    for seed in range(3):
        t = _case(k, vocab, sub, rank, hidden, conf, with_markov, seed)
        # the anchor as an id, or read from device memory (what a CUDA graph replays)
        anchor = 3 if seed % 2 else torch.tensor([3], device=DEVICE)
        got = markov_greedy_triton(anchor=anchor, **t)
        want = markov_greedy_torch(anchor=3, **t)
        assert got[0].tolist() == want[0].tolist()
        if conf:
            torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)
        else:
            assert got[1] is None and want[1] is None


@pytest.mark.parametrize(
    "k, vocab, sub, rank, hidden, conf, with_markov, temperature",
    [
        (7, 300, None, 8, 48, True, True, 1.0),
        (8, 1000, 257, 16, 64, True, False, 0.7),
        (5, 5000, 700, 64, 100, False, False, 1.3),
    ],
)
def test_sampling_kernel_matches_the_reference(
    k, vocab, sub, rank, hidden, conf, with_markov, temperature
):
    from specgen.kernels.markov import markov_sample_triton

    for seed in range(3):
        t = _case(k, vocab, sub, rank, hidden, conf, with_markov, seed)
        gen = torch.Generator().manual_seed(100 + seed)
        noise = torch.empty(k, t["base"].shape[1]).exponential_(generator=gen).to(DEVICE)
        tokens, z, q = markov_sample_triton(anchor=3, noise=noise, temperature=temperature, **t)
        want = markov_greedy_torch(anchor=3, noise=noise, temperature=temperature, **t)
        assert tokens.tolist() == want[0].tolist()
        torch.testing.assert_close(q, want[2], rtol=1e-5, atol=1e-6)
        if conf:
            torch.testing.assert_close(z, want[1], rtol=1e-5, atol=1e-5)
        # different noise, different draws: the race really samples
        other = markov_sample_triton(anchor=3, noise=noise.roll(1, 1), temperature=temperature, **t)
        assert other[0].tolist() != tokens.tolist() or k == 1


def test_the_reference_is_the_drafters_sampled_draw(target, tiny_dspark):
    from specgen.core.config import SamplingParams
    from specgen.methods.dspark.drafter import markov_draw, race_noise
    from specgen.methods.dspark.network import load_dspark

    net = load_dspark(tiny_dspark, target=target, target_name="t", name="d")
    gen = torch.Generator().manual_seed(0)
    slots = torch.randn(net.args.max_drafts, target.args.hidden_size, generator=gen)
    base = target.head(slots)
    noise = race_noise(base.shape[0], base.shape[1], gen, base.device)
    params = SamplingParams(temperature=0.8)
    draft = markov_draw(net, base, slots, 7, params, None, noise=noise)
    tokens, conf, q = markov_greedy_torch(
        base, slots, 7, net.markov_w1, net.markov_w2, None, net.conf_w, net.conf_b,
        noise=noise, temperature=0.8,
    )  # fmt: skip
    assert tokens.tolist() == draft.tokens[0].tolist()
    torch.testing.assert_close(q[None], draft.probs)


def test_the_reference_is_the_drafters_greedy_draw(target, tiny_dspark):
    from specgen.core.config import SamplingParams
    from specgen.methods.dspark.drafter import markov_draw
    from specgen.methods.dspark.network import load_dspark

    net = load_dspark(tiny_dspark, target=target, target_name="t", name="d")
    gen = torch.Generator().manual_seed(0)
    slots = torch.randn(net.args.max_drafts, target.args.hidden_size, generator=gen)
    base = target.head(slots)
    draft = markov_draw(net, base, slots, 7, SamplingParams(), None)
    tokens, conf = markov_greedy_torch(
        base, slots, 7, net.markov_w1, net.markov_w2, None, net.conf_w, net.conf_b
    )
    assert tokens.tolist() == draft.tokens[0].tolist()
    torch.testing.assert_close(conf.sigmoid()[None], draft.confidence)


@pytest.fixture(scope="module")
def target(tiny_qwen3_deep):
    from specgen.models.loading import load_target

    return load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiles of 16 rows: many programs per slot, so the cross-tile reduction is exercised."""
    from specgen.kernels import markov

    monkeypatch.setattr(markov, "TILE_ELEMENTS", 16)


@pytest.mark.parametrize("temperature", [None, 0.9])
def test_many_tiles_reduce_to_the_reference(small_tiles, temperature):
    from specgen.kernels.markov import markov_greedy_triton, markov_sample_triton

    for seed in range(2):
        t = _case(6, 900, 333, 8, 40, True, True, seed)
        if temperature is None:
            got = markov_greedy_triton(anchor=3, **t)
            want = markov_greedy_torch(anchor=3, **t)
        else:
            gen = torch.Generator().manual_seed(7 + seed)
            noise = torch.empty(6, 333).exponential_(generator=gen).to(DEVICE)
            got = markov_sample_triton(anchor=3, noise=noise, temperature=temperature, **t)
            want = markov_greedy_torch(anchor=3, noise=noise, temperature=temperature, **t)
            torch.testing.assert_close(got[2], want[2], rtol=1e-5, atol=1e-6)
        assert got[0].tolist() == want[0].tolist()
        torch.testing.assert_close(got[1], want[1], rtol=1e-5, atol=1e-5)


def test_a_tie_across_tiles_goes_to_the_first_index(small_tiles):
    from specgen.kernels.markov import markov_greedy_triton

    t = _case(3, 200, None, 4, 16, False, False, 0)
    t["w2"] = torch.zeros_like(t["w2"])  # the logits are the base alone
    base = torch.zeros(3, 200)
    base[0, [40, 170]] = 5.0  # tiles 2 and 10 (16 rows each)
    base[1, [17, 18, 199]] = 2.0  # one tile, then the last
    base[2, [0, 16]] = 1.0  # the very first row
    t["base"] = base.to(DEVICE)
    tokens, _ = markov_greedy_triton(anchor=3, **t)
    assert tokens.tolist() == [40, 17, 0]
    assert tokens.tolist() == markov_greedy_torch(anchor=3, **t)[0].tolist()
