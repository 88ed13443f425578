"""A few optimiser steps on a tiny target lower the loss, and the written checkpoint loads
back (same outputs) and decodes losslessly."""

from __future__ import annotations

import pytest
import torch

from specgen.config import SpecConfig
from specgen.models.dflash import load_dflash
from specgen.models.dspark import load_dspark
from specgen.models.loading import load_target, read_config
from specgen.pipeline import Pipeline
from specgen.training.checkpoint import save_drafter
from specgen.training.trainer import Sequence, sequence_loss, trainable


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_training_lowers_the_loss_and_the_checkpoint_round_trips(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, tmp_path, kind
):
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    load = load_dflash if kind == "dflash" else load_dspark
    net = load(tiny_dflash if kind == "dflash" else tiny_dspark, target=target,
               target_name="t", name=kind)  # fmt: skip
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    answer = base.generate("The quick brown fox", raw=True, max_new_tokens=40)
    prompt = base.encode("The quick brown fox", raw=True)
    seq = Sequence(prompt + answer.token_ids, len(prompt))
    opt = torch.optim.AdamW(trainable(net), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(25):
        loss, parts = sequence_loss(target, net, seq, anchors_per_sequence=16, gamma=4.0,
                                    generator=gen)  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    out = save_drafter(tmp_path / kind, net, read_config(tiny_qwen3_deep, "t"), dtype=torch.float32)
    again = load(out, target=target, target_name="t", name="trained")
    for (name, a), b in zip(net.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    pipe = base.with_spec(SpecConfig(drafter=str(out), verify_policy="full"))
    assert pipe.spec.method == kind
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=40)
    assert got.token_ids == answer.token_ids
    assert got.stats.accepted > 0  # it learned this answer
