"""A few optimiser steps on a tiny target lower the loss, and the written checkpoint loads
back (same outputs) and decodes losslessly."""

from __future__ import annotations

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.methods.dspark.network import load_dspark
from specgen.models.drafters.dflash import load_dflash
from specgen.models.loading import load_target, read_config
from specgen.training.kind import training_of
from specgen.training.trainer import Sequence


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
    hooks = training_of(kind)
    opt = torch.optim.AdamW(hooks.trainable(net), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(25):
        loss, parts = hooks.loss(target, net, seq, anchors_per_sequence=16, gamma=4.0,
                                 generator=gen)  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    out = hooks.save(tmp_path / kind, net, read_config(tiny_qwen3_deep, "t"), dtype=torch.float32)
    again = load(out, target=target, target_name="t", name="trained")
    for (name, a), b in zip(net.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    pipe = base.with_spec(SpecConfig(drafter=str(out), verify_policy="full"))
    assert pipe.spec.method == kind
    got = pipe.generate("The quick brown fox", raw=True, max_new_tokens=40)
    assert got.token_ids == answer.token_ids
    assert got.stats.accepted > 0  # it learned this answer


@pytest.mark.slow
def test_training_loop_resumes_and_writes_a_loadable_drafter(
    tiny_qwen3_deep, tiny_answers, tmp_path
):
    import json

    from specgen.training.loop import TrainConfig, load_sequences, train
    from specgen.training.state import load_state

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    data = load_sequences(tiny_answers)
    cfg = TrainConfig(kind="dspark", block_size=4, target_layers=(1, 3), mask_token_id=319,
                      markov_rank=8, steps=9, warmup=2, checkpoint_every=3, lr=3e-3)  # fmt: skip
    config = read_config(tiny_qwen3_deep, "t")
    whole = train(target, config, data, cfg, tmp_path / "whole")
    assert whole["steps"] == 9 and (tmp_path / "whole" / "state.safetensors").is_file()

    hooks = training_of("dspark")
    calls, real = [], hooks.loss

    def interrupted(*args, **kwargs):  # killed during step 8, after the step-6 checkpoint
        calls.append(1)
        if len(calls) > 7 * len(data):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    hooks.loss = interrupted  # the instance's own attribute, removed below
    try:
        with pytest.raises(KeyboardInterrupt):
            train(target, config, data, cfg, tmp_path / "d")
    finally:
        del hooks.loss
    # the stopped run left a drafter: the step-6 checkpoint's weights, marked unfinished
    stopped = load_dspark(tmp_path / "d", target=target, target_name="t", name="stopped")
    record = json.loads((tmp_path / "d" / "config.json").read_text())["specgen_training"]
    assert record == {"steps": 6, "finished": False}
    at_six = load_state(tmp_path / "d" / "state.safetensors")
    assert at_six["step"] == 6
    assert torch.equal(stopped.backbone.fc, at_six["net"]["backbone.fc"].to(torch.bfloat16).float())
    more = train(target, config, data, cfg, tmp_path / "d", resume=True)
    assert more["steps"] == 9
    # trained through the data's head rows: the drafter drafts from those rows only
    vocab = json.loads((tmp_path / "d" / "draft_vocab.json").read_text())["token_ids"]
    assert set(vocab) == {t for s in data for t in s.ids}
    a = load_state(tmp_path / "whole" / "state.safetensors")["net"]
    b = load_state(tmp_path / "d" / "state.safetensors")["net"]
    for name in a:  # resumed = uninterrupted, bit for bit
        assert torch.equal(a[name], b[name]), name
    pipe = base.with_spec(SpecConfig(drafter=str(tmp_path / "d"), verify_policy="full"))
    assert pipe.spec.method == "dspark"
    want = base.generate("The quick brown fox", raw=True, max_new_tokens=20).token_ids
    assert pipe.generate("The quick brown fox", raw=True, max_new_tokens=20).token_ids == want


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_drafter_layers_start_as_the_targets_next_layers(tiny_dirs, family):
    from specgen.training.init import init_from_target
    from specgen.training.loop import TrainConfig

    target = load_target(tiny_dirs[family], dtype=torch.float32, device="cpu")
    config = read_config(tiny_dirs[family], "t")
    cfg = TrainConfig(draft_layers=2, target_layers=(1, 0))
    n = target.args.num_layers
    hooks = training_of("dflash")
    net = hooks.new(target, hooks.config(config, n, cfg, None), cfg, None)
    init_from_target(net, target)
    sources = [target.layers[min(2 + i, n - 1)] for i in range(2)]  # after the top tap
    for mine, theirs in zip(net.layers, sources, strict=True):
        torch.testing.assert_close(mine.wqkv.dense(), theirs.wqkv.dense())
        torch.testing.assert_close(mine.w_down.dense(), theirs.w_down.dense())
    h = target.args.hidden_size
    torch.testing.assert_close(net.fc[:, :h], torch.eye(h))  # the top tap passes through
    torch.testing.assert_close(net.norm, target.norm)


@pytest.mark.slow
def test_a_run_in_sessions_is_the_run_at_once(tiny_qwen3_deep, tiny_answers, tmp_path):
    """`session_minutes` ends a process early (0: after one step), its state saved and an
    unfinished drafter written; resumed session after session, a step-bounded run takes
    the same steps as one uninterrupted run, bit for bit."""
    import json
    from dataclasses import replace

    from specgen.training.loop import TrainConfig, load_sequences, train
    from specgen.training.state import load_state

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    data = load_sequences(tiny_answers)
    cfg = TrainConfig(kind="dflash", block_size=4, target_layers=(1, 3), mask_token_id=319,
                      steps=4, warmup=2, lr=3e-3, eval_minutes=0)  # fmt: skip
    config = read_config(tiny_qwen3_deep, "t")
    whole = train(target, config, data, cfg, tmp_path / "whole")
    assert whole["finished"] and whole["steps"] == 4
    for n in range(1, 5):
        part = train(target, config, data, replace(cfg, session_minutes=0), tmp_path / "s",
                     resume=True)  # fmt: skip
        assert (part["steps"], part["finished"]) == (n, n == 4)
    a = load_state(tmp_path / "whole" / "state.safetensors")["net"]
    b = load_state(tmp_path / "s" / "state.safetensors")
    for name in a:
        assert torch.equal(a[name], b["net"][name]), name
    # answers that came since do not change the rows the run drafts from
    more = [*data, Sequence([1, 2, 3, 300, 301, 302], 3)]
    train(target, config, more, cfg, tmp_path / "s", resume=True)
    written = json.loads((tmp_path / "s" / "draft_vocab.json").read_text())["token_ids"]
    assert written == b["vocab"] == sorted({t for s in data for t in s.ids})


def test_a_draft_vocabulary_keeps_the_answers_most_frequent_tokens(tiny_qwen3_deep):
    from specgen.training.trainer import Vocab

    target = load_target(tiny_qwen3_deep, dtype=torch.float32, device="cpu")
    # answers (after the 2-token prompts): 7 three times, 9 twice, 5 once; 3 only in prompts
    data = [Sequence([3, 3, 7, 9, 7], 2), Sequence([3, 5, 7, 9, 5], 2)]
    assert Vocab.of(target, data).ids.tolist() == [3, 5, 7, 9]
    top = Vocab.of(target, data, limit=2)
    assert top.ids.tolist() == [7, 9]
    assert top.targets(torch.tensor([7, 5, 9, -1])).tolist() == [0, -1, 1, -1]  # 5: no row
    torch.testing.assert_close(top.head, target.lm_head.lookup(torch.tensor([7, 9])))
