"""ModelArgs from real config.json files, and refusals of what we cannot run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specgen.core.config import SamplingParams
from specgen.core.errors import CheckpointError, SpecgenError
from specgen.models.families import model_args

# Real config.json files of the Qwen3 targets and the public drafters (see README there).
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


QWEN3_4B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "eos_token_id": 151645,
    "bos_token_id": 151643,
    "sliding_window": None,
    "use_sliding_window": False,
}


def test_qwen3_4b_config():
    args = model_args(QWEN3_4B)
    assert args.family == "qwen3" and args.qk_norm and not args.qkv_bias
    assert (args.num_layers, args.num_heads, args.num_kv_heads, args.head_dim) == (36, 32, 8, 128)
    assert args.rope.theta == 1e6 and args.rope.kind == "default"
    assert args.tie_word_embeddings and args.eos_token_ids == (151645,)


@pytest.mark.parametrize("name", ["qwen3-4b.config.json", "qwen3-8b.config.json"])
def test_shared_fixture_configs_load(name):
    args = model_args(_fixture(name))
    assert args.family == "qwen3" and args.num_layers == 36


def test_transformers5_rope_parameters_and_qwen2_bias():
    cfg = {**QWEN3_4B, "model_type": "qwen2", "rope_theta": None}
    cfg.pop("head_dim")
    cfg["rope_parameters"] = {"rope_theta": 5e5, "rope_type": "default"}
    args = model_args(cfg)
    assert args.qkv_bias and not args.o_bias and not args.qk_norm
    assert args.head_dim == 2560 // 32 and args.rope.theta == 5e5


def test_llama3_rope_scaling_is_read():
    cfg = {**QWEN3_4B, "model_type": "llama"}
    cfg["rope_scaling"] = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    rope = model_args(cfg).rope
    assert rope.kind == "llama3" and rope.factor == 8.0


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "unsupported architecture"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported RoPE"),
        ({"use_sliding_window": True, "sliding_window": 4096}, "sliding-window"),
        ({"model_type": "mistral", "sliding_window": 4096}, "sliding-window"),  # Mistral v0.1
        ({"hidden_act": "gelu"}, "unsupported activation"),
        ({"hidden_size": None}, "malformed"),
    ],
)
def test_unsupported_configs_are_refused(change, message):
    with pytest.raises(CheckpointError, match=message):
        model_args({**QWEN3_4B, **change}, name="m")


def test_a_mistral_config_is_a_llama_shaped_target():
    args = model_args({**QWEN3_4B, "model_type": "mistral", "sliding_window": None}, name="m")
    assert args.family == "mistral" and not (args.qk_norm or args.qkv_bias or args.o_bias)


def test_missing_field_is_named():
    cfg = dict(QWEN3_4B)
    del cfg["vocab_size"]
    with pytest.raises(CheckpointError, match="vocab_size"):
        model_args(cfg)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": -1.0}, {"temperature": 2.5}, {"top_k": -2}, {"top_p": 0.0},
        {"top_p": 1.5}, {"seed": 2**64}, {"seed": -(2**63) - 1},
    ],
)  # fmt: skip
def test_bad_sampling_params(kwargs):
    with pytest.raises(SpecgenError):
        SamplingParams(**kwargs)


def test_sampling_bounds_edges_pass_and_top_k_minus_one_is_off():
    assert SamplingParams(temperature=2.0, top_p=1.0, seed=2**64 - 1).temperature == 2.0
    assert SamplingParams(top_k=-1).top_k == 0  # the servers' "off"
