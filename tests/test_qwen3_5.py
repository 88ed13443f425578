"""The Qwen3.5 hybrid backbone against transformers' own model, and its checkpoints.

transformers' `Qwen3_5ForConditionalGeneration` is the oracle (fp32): logits and tapped
hidden states for a prefill (the chunked form, across a chunk boundary), decode steps and
a verify block after a prefix (the token-recurrent form). Checkpoints are saved with
`save_pretrained` in the published multimodal layout, vision tower included.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from specgen.core.config import FULL, LINEAR
from specgen.core.errors import CheckpointError
from specgen.models import loading
from specgen.models.families import model_args
from specgen.models.loading import load_target
from specgen.models.transformer import Transformer
from support.targets import TINY_VOCAB, save_tiny_qwen3_5

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TOL = dict(atol=2e-5, rtol=1e-5)  # fp32: the same ops in another order


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("q35")
    hf = save_tiny_qwen3_5(path, seed=1, initializer_range=0.05)  # rounding not amplified
    return hf, load_target(path, dtype=torch.float32, device="cpu"), path


def _reference(hf, ids):
    with torch.no_grad():
        out = hf(input_ids=ids, output_hidden_states=True)
    return out.logits, out.hidden_states


def test_layer_types_and_shapes_come_from_text_config(pair):
    _, ours, _ = pair
    a = ours.args
    assert a.family == "qwen3_5" and a.layout is not None
    assert a.layout.layer_types == (LINEAR, LINEAR, LINEAR, FULL, LINEAR, LINEAR)
    assert a.rotary_dim == 4 and a.attn_output_gate and a.norm_offset  # 16 * 0.25


@pytest.mark.parametrize("prefill", [7, 70])  # 70: the chunked form crosses a chunk boundary
def test_prefill_decode_and_verify_block_match_transformers(pair, prefill):
    hf, ours, _ = pair
    total = prefill + 9
    ids = torch.randint(0, TINY_VOCAB, (1, total), generator=torch.Generator().manual_seed(0))
    ref_logits, ref_hidden = _reference(hf, ids)

    cache = ours.new_cache(128, steps=6)
    first = ours(ids[:, :prefill], cache, taps=(0, 3))  # a Gated DeltaNet and the attention
    decode = [ours(ids[:, i : i + 1], cache) for i in range(prefill, prefill + 3)]
    block = ours(ids[:, prefill + 3 : total], cache, taps=(0, 3))  # 6 tokens: a verify block
    logits = torch.cat([first.logits, *(d.logits for d in decode), block.logits], dim=1)

    torch.testing.assert_close(logits, ref_logits, **TOL)
    for layer in (0, 3):  # taps are decoder-layer outputs: HF hidden_states[id + 1]
        torch.testing.assert_close(first.taps[layer], ref_hidden[layer + 1][:, :prefill], **TOL)
        want = ref_hidden[layer + 1][:, prefill + 3 :]
        torch.testing.assert_close(block.taps[layer], want, **TOL)
    assert cache.length == total


def test_a_verify_block_after_rolling_back_matches_transformers(pair):
    hf, ours, _ = pair
    ids = torch.randint(0, TINY_VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    ref_logits, _ = _reference(hf, ids)
    cache = ours.new_cache(64, steps=5)
    ours(ids[:, :12], cache, num_logits=1)
    wrong = torch.randint(0, TINY_VOCAB, (1, 5), generator=torch.Generator().manual_seed(9))
    ours(torch.cat([ids[:, 12:14], wrong[:, :3]], dim=1), cache)  # two right, three wrong
    cache.rollback(14)
    block = ours(ids[:, 14:19], cache)
    torch.testing.assert_close(block.logits, ref_logits[:, 14:19], **TOL)


def test_tied_embeddings_and_a_text_only_checkpoint(tmp_path):
    from transformers import Qwen3_5ForCausalLM

    hf = save_tiny_qwen3_5(tmp_path / "mm", seed=2, tie_word_embeddings=True)
    text_only = Qwen3_5ForCausalLM(hf.config.text_config).eval()
    text_only.model.load_state_dict(hf.model.language_model.state_dict())
    text_only.save_pretrained(tmp_path / "text")
    ids = torch.randint(0, TINY_VOCAB, (1, 11), generator=torch.Generator().manual_seed(2))
    want, _ = _reference(hf, ids)
    for folder in ("mm", "text"):
        ours = load_target(tmp_path / folder, dtype=torch.float32, device="cpu")
        assert ours.args.tie_word_embeddings and ours.lm_head is ours.embed
        torch.testing.assert_close(ours(ids, ours.new_cache(16)).logits, want, **TOL)


def test_the_vision_tower_and_mtp_head_are_never_read(pair, tmp_path, monkeypatch):
    _, _, path = pair
    ckpt = tmp_path / "with-mtp"
    shutil.copytree(path, ckpt)
    save_file({"mtp.fc.weight": torch.zeros(4, 4)}, ckpt / "mtp.safetensors")
    read: list[str] = []
    original = loading.SafetensorsIndex.get

    def spy(self, key, device):
        read.append(key)
        return original(self, key, device)

    monkeypatch.setattr(loading.SafetensorsIndex, "get", spy)
    load_target(ckpt, dtype=torch.float32, device="cpu")
    assert read and all(k.startswith(("model.language_model.", "lm_head.")) for k in read)


def test_half_precision_tracks_transformers(tmp_path):
    """In bf16 we differ from transformers by no more than its own rounding does."""
    hf = save_tiny_qwen3_5(tmp_path, seed=4)
    ids = torch.randint(0, TINY_VOCAB, (1, 11), generator=torch.Generator().manual_seed(4))
    exact, _ = _reference(hf, ids)
    hf_half, _ = _reference(hf.to(torch.bfloat16), ids)
    ours = load_target(tmp_path, dtype=torch.bfloat16, device="cpu")
    mine = ours(ids, ours.new_cache(16)).logits.float()
    theirs = (hf_half.float() - exact).abs().max()
    assert (mine - exact).abs().max() <= 2 * theirs + 1e-2


@pytest.mark.parametrize(
    ("size", "hidden", "layers", "value_heads", "billions"),
    [("4b", 2560, 32, 32, (3.5, 4.5)), ("9b", 4096, 32, 32, (8.0, 9.5)),
     ("27b", 5120, 64, 48, (25.0, 28.0))],
)  # fmt: skip
def test_published_configs_parse_and_build(size, hidden, layers, value_heads, billions):
    cfg = json.loads((FIXTURES / f"qwen3.5-{size}.config.json").read_text())
    args = model_args(cfg, name=f"Qwen3.5-{size}")
    assert (args.hidden_size, args.num_layers, args.vocab_size) == (hidden, layers, 248320)
    assert (
        args.layout.value_heads == value_heads
        and args.layout.layer_types.count(FULL) == layers // 4
    )
    with torch.device("meta"):
        model = Transformer(args, dtype=torch.bfloat16, device="meta")
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()) / 1e9
    assert billions[0] < params < billions[1], params


def test_moe_variants_are_refused_in_one_line():
    cfg = json.loads((FIXTURES / "qwen3.5-9b.config.json").read_text())
    moe = {
        **cfg,
        "model_type": "qwen3_5_moe",
        "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    }
    for config in (moe, {**cfg, "text_config": {**cfg["text_config"], "num_experts": 256}}):
        with pytest.raises(CheckpointError, match="mixture-of-experts targets are not supported"):
            model_args(config, name="Qwen3.5-35B-A3B")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("drop", "checkpoint lacks model.language_model.layers.1.linear_attn.A_log"),
        ("reshape", "linear_attn.conv1d.weight has shape"),
    ],
)
def test_broken_checkpoints_fail_naming_the_tensor(pair, tmp_path, edit, message):
    _, _, path = pair
    ckpt = tmp_path / "broken"
    shutil.copytree(path, ckpt)
    tensors = load_file(ckpt / "model.safetensors")
    if edit == "drop":
        del tensors["model.language_model.layers.1.linear_attn.A_log"]
    else:
        key = "model.language_model.layers.0.linear_attn.conv1d.weight"
        tensors[key] = tensors[key][:, :, :3].contiguous()
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(CheckpointError, match=message):
        load_target(ckpt, dtype=torch.float32, device="cpu")


def test_bad_layer_types_are_refused(pair, tmp_path):
    _, _, path = pair
    cfg = json.loads((path / "config.json").read_text())
    cfg["text_config"]["layer_types"] = ["linear_attention", "mamba"] * 3
    with pytest.raises(CheckpointError, match="layer_types must give"):
        model_args(cfg, name="x")
