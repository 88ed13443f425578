"""`specgen train --kind eagle3`: the training-time-test chain computes what inference's
chain computes, the offline walk accepts what real decoding accepts, and the written
checkpoint (SpecForge's layout) loads as an EAGLE-3 drafter and decodes losslessly."""

from __future__ import annotations

import json

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.core.config import SpecConfig
from specgen.methods.eagle3.drafter import Eagle3Method
from specgen.methods.eagle3.network import load_eagle3
from specgen.methods.eagle3.training import (
    CHAIN,
    accepted_lengths,
    chain_hidden,
    chain_logits,
    eagle3_config,
    eagle3_loss,
    new_eagle3,
    trainable,
)
from specgen.methods.eagle3.training import (
    save_eagle3 as write_eagle3,
)
from specgen.models.loading import load_target, read_config
from specgen.training.trainer import Sequence, Vocab, prepare
from support.cli import assert_one_line_error, run
from support.eagle3 import save_eagle3, save_target

TEXT = "The quick brown fox"


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return save_target(tmp_path_factory.mktemp("eagle3-train") / "t")


@pytest.fixture(scope="module")
def target(target_dir):
    return load_target(target_dir, dtype=torch.float32, device="cpu")


@pytest.fixture(scope="module")
def ar(target_dir):
    return Pipeline.load(str(target_dir), device="cpu", dtype="float32")


def _net(target, path):
    return load_eagle3(path, target=target, target_name="t", name=str(path)).float()


@pytest.mark.parametrize(
    "layout, kwargs",
    [("specforge", {}), ("speculators", {"layers": 2, "options": {"model_type": "qwen3"}}),
     ("deepspec", {"layers": 2})],
)  # fmt: skip
def test_chain_equals_inference_drafts(tmp_path, target_dir, target, ar, layout, kwargs):
    """Teacher-forced on the drafter's own greedy chain, the training chain drafts it again
    at every step, with the same hidden states."""
    path = save_eagle3(tmp_path / layout, layout, target=target_dir, **kwargs)
    net = _net(target, path)
    method = Eagle3Method(net, target, CHAIN)
    prompt = ar.encode(TEXT, raw=True)
    for cut in (3, len(prompt) - 1):
        committed, anchor = prompt[:cut], prompt[cut]
        drafter = method.new_drafter(64)
        with torch.no_grad():
            out = target(torch.tensor([committed]), target.new_cache(64), taps=drafter.taps)
        drafter.observe(committed, out.taps)
        want = drafter.propose(anchor, CHAIN).tokens[0].tolist()
        seq = Sequence([*committed, anchor, *want], len(committed))
        item = prepare(target, seq, drafter.taps, last=False)
        with torch.no_grad():
            hidden = chain_hidden(target, net, item, torch.tensor([cut]), CHAIN)
            logits = chain_logits(target, net, torch.stack(hidden, dim=1))
        got = net.to_target[logits.argmax(-1)][0].tolist()
        assert got == want, (cut, got, want)


def _trained(target, target_dir, ar, tmp_path, steps=40):
    """A drafter trained on the start of one answer (it then accepts some drafts, misses others)."""
    prompt = ar.encode(TEXT, raw=True)
    answer = ar.generate(TEXT, raw=True, max_new_tokens=48).token_ids
    seq = Sequence(prompt + answer[:12], len(prompt))
    vocab = Vocab.of(target, [Sequence(prompt + answer, len(prompt))])
    config = eagle3_config(read_config(target_dir, "t"), (1, 4, 6), int(vocab.ids.shape[0]))
    net = new_eagle3(target, config, vocab, seed=0)
    assert len(trainable(net)) == len(list(net.parameters())) == 10  # hidden_norm among them
    assert all(bool(p.isfinite().all()) for p in net.parameters())
    assert bool((net.hidden_norms[0] == 1).all())
    item = prepare(target, seq, net.args.taps, last=False)
    opt = torch.optim.AdamW(trainable(net), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(steps):
        loss, _ = eagle3_loss(target, net, item, anchors_per_sequence=16, gamma=4.0,
                              generator=gen, vocab=vocab)  # fmt: skip
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) < 0.9 * sum(losses[:5])
    out = write_eagle3(tmp_path / "trained", net, config, dtype=torch.float32)
    return net, out, prompt, answer


@pytest.mark.slow
def test_offline_walk_accepts_what_real_decoding_accepts(tmp_path, target_dir, target, ar):
    net, out, prompt, answer = _trained(target, target_dir, ar, tmp_path)
    pipe = ar.with_spec(SpecConfig(drafter=str(out), verify_policy="full", trace=True))
    assert pipe.spec.method == "eagle3"
    got = pipe.generate(TEXT, raw=True, max_new_tokens=48)
    assert got.token_ids == answer
    again = _net(target, out)  # the checkpoint holds the trained weights
    for (name, a), b in zip(net.state_dict().items(), again.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, msg=name)
    item = prepare(target, Sequence(prompt + answer, len(prompt)), net.args.taps, last=False)
    lo, accepted = accepted_lengths(target, net, item, None)
    assert lo == len(prompt)
    steps = got.stats.trace[1:-1]  # after the prefill; the last step is cut by the token cap
    assert any(r["accepted"] > 0 for r in steps) and any(r["accepted"] == 0 for r in steps)
    p = lo
    for record in steps:
        assert int(accepted[p - lo]) == record["accepted"], p
        p += record["accepted"] + 1


@pytest.mark.slow
def test_cli_trains_an_eagle3_drafter(tmp_path, target_dir, ar):
    rows = []
    for text in (TEXT, "def add(a, b):", "Speculative decoding", "one two three"):
        ids = ar.encode(text, raw=True)
        answer = ar.generate(text, raw=True, max_new_tokens=24).token_ids
        rows.append({"prompt_ids": ids, "response_ids": answer})
    data = tmp_path / "answers.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "e3"
    result = run("train", "--kind", "eagle3", "--data", str(data), "--out", str(out),
                 "--model", str(target_dir), "--steps", "6", "--device", "cpu",
                 "--target-layers", "1,4,6")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 4, 6]
    pipe = ar.with_spec(SpecConfig(drafter=str(out), verify_policy="full"))
    assert pipe.spec.method == "eagle3"
    want = ar.generate(TEXT, raw=True, max_new_tokens=24).token_ids
    assert pipe.generate(TEXT, raw=True, max_new_tokens=24).token_ids == want


def test_cli_refuses_a_warm_start_for_eagle3(tmp_path, target_dir):
    result = run("train", "--kind", "eagle3", "--data", str(tmp_path / "x.jsonl"), "--out",
                 str(tmp_path / "o"), "--model", str(target_dir), "--steps", "1",
                 "--init", "target")  # fmt: skip
    assert_one_line_error(result, 2, "--kind eagle3 starts from random weights only")
