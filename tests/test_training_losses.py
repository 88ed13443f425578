"""Drafter training losses on hand-made logits, and the teacher-forced Markov head."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from oracles.dspark import reference_heads
from specgen.methods.dspark.network import load_dspark
from specgen.methods.dspark.training import dspark_loss, markov_logits
from specgen.models.loading import load_target
from specgen.training.losses import dflash_loss, slot_weights


def test_slot_weights_decay_and_stop_at_the_first_missing_target():
    w = slot_weights(torch.tensor([[5, 6, 7], [5, -1, 7]]), gamma=2.0)
    assert w[0].tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    assert w[1].tolist() == [1.0, 0.0, 0.0]


def test_dflash_loss_is_the_weighted_cross_entropy():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 1.0, 0.0]]])
    targets = torch.tensor([[0, 2]])
    ce = F.cross_entropy(logits[0], targets[0], reduction="none")
    w = torch.tensor([1.0, math.exp(-1 / 4)])
    assert dflash_loss(logits, targets, 4.0).item() == pytest.approx(
        ((w * ce).sum() / w.sum()).item()
    )


def test_dspark_loss_parts():
    target = torch.tensor([[[3.0, 0.0, 0.0]]])
    perfect, parts = dspark_loss(target.clone(), target, torch.tensor([[0]]), None, 4.0)
    assert parts["l1"] == pytest.approx(0.0, abs=1e-6)
    _, off = dspark_loss(torch.tensor([[[0.0, 3.0, 0.0]]]), target, torch.tensor([[0]]),
                         torch.tensor([[0.0]]), 4.0)  # fmt: skip
    p = torch.tensor([3.0, 0.0, 0.0]).softmax(-1)
    q = torch.tensor([0.0, 3.0, 0.0]).softmax(-1)
    assert off["l1"] == pytest.approx((p - q).abs().sum().item(), rel=1e-5)
    accept = 1 - 0.5 * (p - q).abs().sum()
    bce = F.binary_cross_entropy_with_logits(torch.tensor(0.0), accept)
    assert off["bce"] == pytest.approx(bce.item(), rel=1e-5)


@pytest.mark.parametrize("kind", ["vanilla", "gated", "rnn"])
def test_teacher_forced_markov_logits_match_the_oracle(tiny_qwen3_deep, tmp_path, kind):
    from support.drafters import save_tiny_dspark

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    net = load_dspark(save_tiny_dspark(tmp_path / kind, kind=kind), target=target,
                      target_name="t", name=kind)  # fmt: skip
    gen = torch.Generator().manual_seed(1)
    base, hidden = torch.randn(7, 320, generator=gen), torch.randn(7, 64, generator=gen)
    tokens = torch.randint(0, 300, (7,), generator=gen).tolist()
    prev = torch.tensor([[5, *tokens[:-1]]])
    got = markov_logits(net, base[None], hidden[None], prev)[0]
    want, _ = reference_heads(net, base, hidden, 5, tokens)
    torch.testing.assert_close(got.double(), want, atol=2e-4, rtol=1e-5)
