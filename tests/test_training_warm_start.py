"""Training further from a trained drafter (`specgen train --init DIR`), and a held-out split
that stays put as answers are appended (so the further-trained drafter is judged on answers
it never saw)."""

from __future__ import annotations

import pytest
import torch

from specgen.core.errors import CheckpointError
from specgen.methods.dspark.network import load_dspark
from specgen.models.loading import load_target, read_config
from specgen.training.loop import TrainConfig, load_sequences, split_holdout, train
from specgen.training.trainer import Sequence


def test_appended_answers_never_cross_the_held_out_split():
    data = [Sequence([i, i + 1], 1) for i in range(300)]
    train_a, held_a = split_holdout(data, 65)
    train_b, held_b = split_holdout(data + [Sequence([7, 8], 1)] * 400, 65)
    assert len(held_a) == 4 and len(train_a) + len(held_a) == 300
    assert all(any(s is h for h in held_b) for s in held_a)  # still held out
    assert all(any(s is t for t in train_b) for s in train_a)  # still trained on
    assert split_holdout(data[:100], 65) == (data[:100], [])  # too few to hold any out


@pytest.mark.slow
def test_a_drafter_trains_on_from_another_ones_weights(tiny_qwen3_deep, tiny_answers, tmp_path):
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    config = read_config(tiny_qwen3_deep, "t")
    data = load_sequences(tiny_answers)
    shape = dict(kind="dspark", block_size=4, target_layers=(1, 3), mask_token_id=319,
                 markov_rank=8, warmup=2)  # fmt: skip
    train(target, config, data, TrainConfig(**shape, steps=6, lr=3e-3), tmp_path / "first")
    first = load_dspark(tmp_path / "first", target=target, target_name="t", name="first")

    # at a zero learning rate, training on starts and ends at the first drafter's weights
    still = TrainConfig(**shape, steps=2, lr=0.0, init_from=str(tmp_path / "first"))
    train(target, config, data, still, tmp_path / "still")
    again = load_dspark(tmp_path / "still", target=target, target_name="t", name="still")
    for (name, a), b in zip(first.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # and from a random start it does not
    fresh = TrainConfig(**shape, steps=2, lr=0.0, seed=1)
    train(target, config, data, fresh, tmp_path / "fresh")
    other = load_dspark(tmp_path / "fresh", target=target, target_name="t", name="fresh")
    assert not torch.equal(first.backbone.fc, other.backbone.fc)

    wider = TrainConfig(**{**shape, "markov_rank": 16}, steps=1, init_from=str(tmp_path / "first"))
    with pytest.raises(CheckpointError, match="--markov-rank"):
        train(target, config, data, wider, tmp_path / "wider")
    as_dflash = TrainConfig(**{**shape, "kind": "dflash"}, steps=1,
                            init_from=str(tmp_path / "first"))  # fmt: skip
    with pytest.raises(CheckpointError, match="cannot start a dflash"):
        train(target, config, data, as_dflash, tmp_path / "as-dflash")
