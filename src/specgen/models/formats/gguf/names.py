"""Which GGUF architectures specgen runs, and each one's tensor names as the load plans
name them.

llama.cpp's converter names a block's tensors `blk.N.attn_q.weight` where the HF
checkpoint has `model.layers.N.self_attn.q_proj.weight`. The `gguf` package's own map
(`gguf.get_tensor_name_map`) lists every name any converter ever read for each tensor;
the tables below are the one name per tensor the load plans use, for the architectures
specgen runs (tests/test_gguf_reader.py holds them to `gguf`'s map, tensor by tensor).
The same GGUF name may stand for different HF tensors in different architectures: a
Gemma 4 block's `ffn_norm` is its pre-feedforward norm, a Llama block's the norm after
attention.
"""

from __future__ import annotations

from pathlib import Path

from specgen.core.errors import CheckpointError
from specgen.models.formats.gguf.reader import GGUFFile

TOP = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}

_ATTENTION = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LLAMA = {**_ATTENTION, "ffn_norm": "post_attention_layernorm"}

# general.architecture -> {block tensor: HF name under model.layers.N.}; a GGUF name that
# ends in `.weight`/`.bias` keeps its suffix, the others (`ssm_a`) stand alone
BLOCKS: dict[str, dict[str, str]] = {
    "llama": _LLAMA,
    "qwen2": _LLAMA,
    "qwen3": _LLAMA,
    "qwen35": {
        **_ATTENTION,
        "post_attention_norm": "post_attention_layernorm",
        "attn_qkv": "linear_attn.in_proj_qkv",
        "attn_gate": "linear_attn.in_proj_z",
        "ssm_beta": "linear_attn.in_proj_b",
        "ssm_alpha": "linear_attn.in_proj_a",
        "ssm_conv1d": "linear_attn.conv1d",
        "ssm_a": "linear_attn.A_log",
        "ssm_dt.bias": "linear_attn.dt_bias",  # Qwen3NextModel's rename of dt_bias
        "ssm_norm": "linear_attn.norm",
        "ssm_out": "linear_attn.out_proj",
    },
    "gemma3": {
        **_ATTENTION,
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "gemma4": {
        **_ATTENTION,
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
        "layer_output_scale.weight": "layer_scalar",  # Gemma4Model's rename
    },
}
ARCHITECTURES = tuple(BLOCKS)

# the HF `model_type` transformers gives a GGUF architecture, where it is not the
# architecture itself (refusals name the model as its config would)
MODEL_TYPES = {"gemma3n": "gemma3n_text", "gemma2": "gemma2", "phi3": "phi3"}
MIXTURES = {"qwen35moe": "Qwen3.5", "qwen3moe": "Qwen3", "qwen2moe": "Qwen2",
            "qwen3next": "Qwen3-Next"}  # fmt: skip


def open_gguf(path: Path, name: str) -> GGUFFile:
    """The file's header, key/values and tensor index; an architecture specgen does not
    run is refused as soon as it is read, before the rest of the file is parsed."""
    return GGUFFile(path, name, check=lambda arch: checked_architecture(arch, name))


def checked_architecture(arch: str, name: str) -> None:
    """Refuse a GGUF architecture specgen does not run, in the one line a config.json of
    that model gets (models/family.py), naming the GGUF architectures it runs. Nothing
    is imported for it: a refusal comes before torch is loaded."""
    if arch in ARCHITECTURES:
        return
    if arch in MIXTURES:
        raise CheckpointError(
            f"{name}: {MIXTURES[arch]} mixture-of-experts targets are not supported (specgen "
            "has no expert layers)"
        )
    model_type = MODEL_TYPES.get(arch, arch)
    raise CheckpointError(
        f"{name}: unsupported architecture {model_type!r} (GGUF {arch}); specgen runs the "
        f"{', '.join(ARCHITECTURES)} GGUF architectures"
    )


def plan_names(arch: str, tensors, layers: int) -> dict[str, str]:
    """Plan key -> GGUF tensor name, for the tensors of `tensors` the architecture's table
    names in the model's `layers` blocks (others, such as Gemma 4's `rope_freqs` or the
    multi-token-prediction block a Qwen3.5 file may add after its layers, stay unnamed)."""
    out: dict[str, str] = {}
    for full in tensors:
        hf = plan_name(arch, full, layers)
        if hf is not None:
            out[hf] = full
    return out


def plan_name(arch: str, full: str, layers: int) -> str | None:
    if not full.startswith("blk."):
        return _lookup(TOP, full)
    _, layer, rest = full.split(".", 2)
    if not layer.isdigit() or int(layer) >= layers:
        return None
    hf = _lookup(BLOCKS[arch], rest)
    return None if hf is None else f"model.layers.{layer}.{hf}"


def _lookup(table: dict[str, str], rest: str) -> str | None:
    if rest in table:
        return table[rest]
    stem, dot, suffix = rest.rpartition(".")
    if dot and suffix in ("weight", "bias") and stem in table:
        return f"{table[stem]}.{suffix}"
    return None


def gguf_name(arch: str, key: str) -> str:
    """The GGUF tensor name a plan key would have (for messages about a missing one)."""
    for gg, hf in TOP.items():
        for end in ("", ".weight", ".bias"):
            if key == hf + end:
                return gg + end
    if key.startswith("model.layers."):
        _, _, layer, rest = key.split(".", 3)
        for gg, hf in BLOCKS.get(arch, {}).items():
            for end in ("", ".weight", ".bias"):
                if rest == hf + end:
                    return f"blk.{layer}.{gg}{end}"
    return "?"
