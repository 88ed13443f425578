"""The offline acceptance walk replays real decoding, and target features are cached."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.methods.dspark.network import load_dspark
from specgen.models.drafters.dflash import load_dflash
from specgen.models.loading import load_target
from specgen.training.features import SHARD, target_features
from specgen.training.kind import training_of
from specgen.training.trainer import Prepared, Sequence, prepare


def _fit(target, net, hooks, seq: Sequence, steps: int = 30) -> None:
    """A few steps on one answer, so the drafter accepts some drafts and misses others."""
    opt = torch.optim.AdamW(hooks.trainable(net), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(steps):
        loss, _ = hooks.loss(target, net, seq, anchors_per_sequence=16, gamma=4.0,
                             generator=gen)  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_offline_walk_accepts_what_real_decoding_accepts(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, tmp_path, kind
):
    from specgen.models.loading import read_config

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    load = load_dflash if kind == "dflash" else load_dspark
    net = load(tiny_dflash if kind == "dflash" else tiny_dspark, target=target,
               target_name="t", name=kind)  # fmt: skip
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    text = "The quick brown fox"
    prompt = base.encode(text, raw=True)
    answer = base.generate(text, raw=True, max_new_tokens=48).token_ids
    seq = Sequence(prompt + answer, len(prompt))
    hooks = training_of(kind)
    _fit(target, net, hooks, Sequence(prompt + answer[:24], len(prompt)))  # learns half of it
    out = hooks.save(tmp_path / kind, net, read_config(tiny_qwen3_deep, "t"), dtype=torch.float32)
    spec = SpecConfig(drafter=str(out), verify_policy="full", trace=True)
    got = base.with_spec(spec).generate(text, raw=True, max_new_tokens=48)
    assert got.token_ids == answer
    backbone = net.backbone if kind == "dspark" else net
    item = prepare(target, seq, tuple(backbone.args.target_layer_ids), last=kind == "dspark")
    lo, accepted = hooks.accepted_lengths(target, net, item)
    assert lo == len(prompt)
    steps = got.stats.trace[1:-1]  # after the prefill; the last step is cut by the token cap
    assert any(r["accepted"] > 0 for r in steps) and any(r["accepted"] == 0 for r in steps)
    p = lo
    for record in steps:
        assert int(accepted[p - lo]) == record["accepted"], p
        p += record["accepted"] + 1
    result = hooks.evaluate(target, net, [item])
    assert result.tau > 1.0 and result.steps >= len(steps)


def test_features_are_computed_once_and_extended_per_layer(tiny_qwen3_deep, tmp_path):
    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    seqs = [Sequence([5, 9, 11, 20, 7, 3], 2), Sequence([4, 8, 15, 16, 23, 42, 2], 3)]
    first = target_features(target, "t", seqs, (1, 3), tmp_path)
    direct = prepare(target, seqs[1], (1, 3), last=False)
    torch.testing.assert_close(torch.cat([first[1][1], first[1][3]], -1), direct.features)
    shards = list(tmp_path.rglob("*.safetensors"))
    assert len(shards) == 1
    stamp = shards[0].stat().st_mtime_ns
    again = target_features(target, "t", seqs, (3,), tmp_path)  # a subset: read back
    assert shards[0].stat().st_mtime_ns == stamp
    torch.testing.assert_close(again[0][3], first[0][3])
    wider = target_features(target, "t", seqs, (0, 1), tmp_path)  # a new layer: recomputed
    torch.testing.assert_close(wider[0][1], first[0][1])
    assert set(target_features(target, "t", seqs, (0, 1, 3), tmp_path)[0]) == {0, 1, 3}
    other = target_features(target, "t", seqs[:1], (1,), tmp_path)  # other data, other digest
    assert len(list(tmp_path.rglob("*.safetensors"))) == 2 and len(other) == 1
    # answers appended after a full shard: that shard is read back, only the new one computed
    longer = [Sequence([6 + i % 50, 7, 8, 9], 1) for i in range(SHARD)]
    target_features(target, "t", longer, (1,), tmp_path)
    full = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*.safetensors")}
    new = Sequence([3, 1, 4, 1, 5, 9], 2)
    grown = target_features(target, "t", [*longer, new], (1,), tmp_path)
    assert all(p.stat().st_mtime_ns == t for p, t in full.items())
    assert len(list(tmp_path.rglob("*.safetensors"))) == len(full) + 1
    alone = prepare(target, new, (1,), last=False).features
    torch.testing.assert_close(grown[SHARD][1], alone)
    shards[0].write_bytes(b"torn")  # a killed write is recomputed, not trusted
    torch.testing.assert_close(
        target_features(target, "t", seqs, (1,), tmp_path)[0][1], first[0][1]
    )
    item = Prepared.from_layers(seqs[0], first[0], (1, 3), None)
    assert item.features.shape == (6, 2 * target.args.hidden_size)
