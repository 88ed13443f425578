"""llama.cpp's HF -> GGUF converter, as far as the tests' tiny models need it: re-written
from reading ggml-org/llama.cpp (`convert_hf_to_gguf.py` at 0024aa7417ef for
`LlamaModel.permute`, `Qwen3NextModel` and `_LinearAttentionVReorderBase`/`Qwen3_5TextModel`;
`conversion/base.py` at 00bd27a621f9 for `TextModel.set_gguf_parameters`,
`filter_tensors` and `prepare_tensors`' F32 rules; `conversion/gemma.py`'s `Gemma3Model` /
`Gemma4Model` (commit not recorded); `src/llama-quant.cpp` at 007dbbf3fd17 for which
tensors `llama-quantize` quantizes and its fallback types), never imported from it. Each
`convert` has its `unconvert` beside it: the HF tensor the file defines, which the tests'
dense oracle holds.

The tokenizer goes in as a GPT-2 BPE (`tokenizer.ggml.model` "gpt2") for every family: the
tiny tokenizer is a byte-level BPE. llama.cpp writes Gemma 4's as "gemma4" (SentencePiece
pieces with scores); that part of a real file is not reproduced here.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2,
        "qwen3": gguf.MODEL_ARCH.QWEN3, "qwen3_5": gguf.MODEL_ARCH.QWEN35,
        "gemma3": gguf.MODEL_ARCH.GEMMA3, "gemma3_text": gguf.MODEL_ARCH.GEMMA3,
        "gemma4": gguf.MODEL_ARCH.GEMMA4}  # fmt: skip
# llama-quantize's fallback for a K-quant tensor whose rows are not whole 256-blocks
K_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def text_config(config: dict) -> dict:
    return {**config, **config["text_config"]} if "text_config" in config else config


def text_tensors(tensors: dict) -> dict[str, str]:
    """HF key -> the name the converter maps (`language_model.` dropped; vision and audio
    towers, their embedders and an MTP block are not the text model's)."""
    out = {}
    for key in tensors:
        if key.startswith("mtp.") or any(t in key for t in ("visual.", "vision_", "audio_")):
            continue
        if "embed_vision." in key or "embed_audio." in key or "multi_modal_projector." in key:
            continue
        out[key] = key.replace("language_model.", "")
    return out


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """LlamaModel.permute: rows (head, half, i) -> (head, i, half)."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _tile(w: np.ndarray, axis: int, key_heads: int, per_key: int, width: int) -> np.ndarray:
    """_reorder_v_heads: value heads grouped by key head -> tiled, along `axis`."""
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    w = w.reshape(key_heads, per_key, width, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(w, 0, axis)


def _untile(w: np.ndarray, axis: int, key_heads: int, per_key: int, width: int) -> np.ndarray:
    w = np.moveaxis(w, axis, 0)
    shape = w.shape
    w = w.reshape(per_key, key_heads, width, *shape[1:]).swapaxes(0, 1).reshape(shape)
    return np.moveaxis(w, 0, axis)


class Converter:
    """One model's conversion: `convert(name, w)` -> (GGUF name, array) as the converter
    writes it; `unconvert(name, back)` -> the HF array the file's values define."""

    def __init__(self, arch: str, text: dict, names: gguf.TensorNameMap) -> None:
        arch = "gemma3" if arch == "gemma3_text" else arch
        self.arch, self.text, self.names = arch, text, names

    def gguf_name(self, name: str) -> str:
        if self.arch == "qwen3_5" and name.endswith(".dt_bias"):  # Qwen3NextModel's rename
            name = name[: -len(".dt_bias")] + ".dt_proj.bias"
        if self.arch == "gemma4" and name.endswith("layer_scalar"):  # Gemma4Model.filter_tensors
            name += ".weight"
        gg = self.names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert gg is not None, name
        return gg

    def _value_axes(self, name: str):
        """(axis, offset, width) of the value-head axis the reorder touches, or None."""
        t = self.text
        if ".linear_attn." not in name or t["linear_num_key_heads"] == t["linear_num_value_heads"]:
            return None
        qk = 2 * t["linear_num_key_heads"] * t["linear_key_head_dim"]
        dv = t["linear_value_head_dim"]
        for tag, where in ((".in_proj_qkv.", (0, qk, dv)), (".conv1d.", (0, qk, dv)),
                           (".in_proj_z.", (0, 0, dv)), (".in_proj_a.", (0, 0, 1)),
                           (".in_proj_b.", (0, 0, 1)), (".A_log", (0, 0, 1)),
                           (".dt_bias", (0, 0, 1)), (".out_proj.", (1, 0, dv))):  # fmt: skip
            if tag in name:
                return where
        return None

    def _reorder(self, name: str, w: np.ndarray, fn) -> np.ndarray:
        where = self._value_axes(name)
        if where is None:
            return w
        axis, offset, width = where
        t = self.text
        k = t["linear_num_key_heads"]
        per_key = t["linear_num_value_heads"] // k
        head = np.take(w, range(offset), axis=axis)
        tail = np.take(w, range(offset, w.shape[axis]), axis=axis)
        return np.concatenate([head, fn(tail, axis, k, per_key, width)], axis=axis)

    def grouped(self, name: str, w: np.ndarray) -> np.ndarray:
        """A tensor of the file with its value heads back in HF's grouped order."""
        return self._reorder(name, w, _untile)

    def convert(self, name: str, w: np.ndarray) -> tuple[str, np.ndarray]:
        w = w.astype(np.float32)  # prepare_tensors: every source dtype to F32 first
        t = self.text
        if self.arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            w = _permute(w, t["num_attention_heads"] if ".q_proj." in name
                         else t["num_key_value_heads"])  # fmt: skip
        if self.arch == "qwen3_5":
            if ".conv1d." in name:
                w = w.squeeze()
            w = self._reorder(name, w, _tile)
            if name.endswith(".A_log"):
                w = -np.exp(w)
            elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                w = w + np.float32(1)
        if self.arch == "gemma3" and name.endswith("norm.weight"):  # Gemma3Model.norm_shift
            w = w + np.float32(1)
        return self.gguf_name(name), w

    def unconvert(self, name: str, back: np.ndarray) -> np.ndarray:
        """The HF tensor of the file's model (float64 arithmetic, then F32)."""
        t = self.text
        w = back.astype(np.float64)
        if self.arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            w = _unpermute(w, t["num_attention_heads"] if ".q_proj." in name
                           else t["num_key_value_heads"])  # fmt: skip
        if self.arch == "qwen3_5":
            w = self._reorder(name, w, _untile)
            if name.endswith(".A_log"):
                w = np.log(-w)
            elif name.endswith("norm.weight") and not name.endswith("linear_attn.norm.weight"):
                w = w - 1  # exact here: the tests' norms stay in [0.5, 2) (checked)
                assert np.array_equal((w.astype(np.float32) + np.float32(1)), back), name
            if ".conv1d." in name:
                w = w[:, None, :]
            if name.endswith(".A_log"):  # kept float64: -exp of it is then the file's decay
                return w
        if self.arch == "gemma3" and name.endswith("norm.weight"):
            w = w - 1  # the model the file defines: its norms scale by the stored value
            assert np.array_equal((w.astype(np.float32) + np.float32(1)), back), name  # exact
        return w.astype(np.float32)

    def extra_tensors(self, tensors: dict) -> dict[str, np.ndarray]:
        """Gemma4Model.generate_extra_tensors: the global layers' proportional-RoPE table."""
        if self.arch != "gemma4":
            return {}
        rope = self.text["rope_parameters"]["full_attention"]
        dim = gemma_head_dims(self.text, tensors)[1]
        turning = int(dim * rope["partial_rotary_factor"] / 2)
        values = [1.0] * turning + [1e30] * (dim // 2 - turning)
        return {"rope_freqs.weight": np.array(values, dtype=np.float32)}


def file_kind(gg: str, shape: tuple[int, ...], kinds: dict[str, str]) -> str | None:
    """The GGUF type of tensor `gg` in a file whose 2-D weights `kinds` names by pattern
    (the first pattern `gg` contains; "" matches all), None for F32: prepare_tensors keeps
    1-D tensors, norms, `ssm_conv1d` and non-`.weight` tensors F32, and llama-quantize
    never quantizes them; a row that is not whole blocks falls back as llama-quantize does
    (K-quants to a 32-block type, anything to F16)."""
    if len(shape) <= 1 or gg.endswith("_norm.weight") or ".ssm_conv1d." in gg:
        return None
    if not gg.endswith(".weight"):
        return None
    kind = next((k for pat, k in kinds.items() if pat in gg), None)
    if kind is None:
        return None
    if kind in K_FALLBACK and shape[1] % 256:
        kind = K_FALLBACK[kind]
    return "F16" if shape[1] % 32 else kind


def gemma_head_dims(text: dict, tensors: dict) -> tuple[int, int]:
    """(sliding, global) head dims, from the q projections (transformers 5 saves the
    global one as `per_layer_config`, the published configs as `global_head_dim`)."""
    types, heads = text["layer_types"], text["num_attention_heads"]
    dims = {}
    for key, w in tensors.items():
        if key.endswith("self_attn.q_proj.weight"):
            layer = int(key.split(".layers.")[1].split(".")[0])
            dims[types[layer]] = w.shape[0] // heads
    return dims["sliding_attention"], dims["full_attention"]


def write_metadata(writer: gguf.GGUFWriter, arch: str, config: dict, tensors: dict, *,
                   mtp: int = 0) -> None:  # fmt: skip
    """The key/values llama.cpp's converter writes for these models (with `mtp`
    multi-token-prediction blocks counted in, as _Qwen35MtpMixin counts them)."""
    t = text_config(config)
    writer.add_block_count(t["num_hidden_layers"] + mtp)
    if mtp:
        writer.add_nextn_predict_layers(mtp)
    writer.add_context_length(t["max_position_embeddings"])
    writer.add_embedding_length(t["hidden_size"])
    writer.add_feed_forward_length(t["intermediate_size"])
    writer.add_head_count(t["num_attention_heads"])
    writer.add_head_count_kv(t["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(t["rms_norm_eps"])
    rope = t.get("rope_parameters") or {}
    if arch in ("gemma3", "gemma3_text"):
        _gemma3_metadata(writer, t)
        return
    if arch == "gemma4":
        _gemma4_metadata(writer, t, tensors)
        return
    writer.add_rope_freq_base(rope.get("rope_theta", t.get("rope_theta", 10000.0)))
    if t.get("head_dim"):
        writer.add_key_length(t["head_dim"])
        writer.add_value_length(t["head_dim"])
    if arch == "qwen3_5":
        writer.add_ssm_conv_kernel(t["linear_conv_kernel_dim"])
        writer.add_ssm_state_size(t["linear_key_head_dim"])
        writer.add_ssm_group_count(t["linear_num_key_heads"])
        writer.add_ssm_time_step_rank(t["linear_num_value_heads"])
        writer.add_ssm_inner_size(t["linear_value_head_dim"] * t["linear_num_value_heads"])
        writer.add_full_attention_interval(t.get("full_attention_interval", 4))
        # Qwen3NextModel reads partial_rotary_factor at the top level (0.25 if absent)
        writer.add_rope_dimension_count(int(t["head_dim"] * t.get("partial_rotary_factor", 0.25)))
        # _Qwen35MRopeMixin: the default sections when the checkpoint states none
        writer.add_rope_dimension_sections(rope.get("mrope_section", [11, 11, 10, 0]))


def _gemma3_metadata(writer: gguf.GGUFWriter, t: dict) -> None:
    """Gemma3Model.set_gguf_parameters (and TextModel's linear RoPE scaling, which llama.cpp
    applies to the global layers only). llama.cpp fixes the rest (module docstring of
    models/formats/gguf/config.py): a file can only hold a model of pattern 6 whose local
    RoPE base is 10000 and whose query_pre_attn_scalar is its head dim (not a 27B), so a
    tiny model that is not one is refused here rather than written as another model."""
    rope = t["rope_parameters"]
    full, local = rope["full_attention"], rope["sliding_attention"]
    types = t["layer_types"]
    want = ["sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(len(types))]
    assert types == want and local["rope_theta"] == 10_000.0, "llama.cpp runs gemma3 so"
    assert t["query_pre_attn_scalar"] == t["head_dim"] and t["num_hidden_layers"] != 62
    assert t.get("attn_logit_softcapping") is None  # the converter asserts it too
    writer.add_key_length(t["head_dim"])
    writer.add_value_length(t["head_dim"])
    writer.add_rope_freq_base(full["rope_theta"])
    if full.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(full["factor"])
    if t.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(t["final_logit_softcapping"])
    if t.get("sliding_window_pattern") != 1:
        writer.add_sliding_window(t["sliding_window"])


def _gemma4_metadata(writer: gguf.GGUFWriter, t: dict, tensors: dict) -> None:
    """Gemma3Model's and Gemma4Model's set_gguf_parameters."""
    rope = t["rope_parameters"]
    types = t["layer_types"]
    writer.add_rope_freq_base(rope["full_attention"]["rope_theta"])
    writer.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
    if t.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(t["final_logit_softcapping"])
    writer.add_sliding_window(t["sliding_window"])
    writer.add_shared_kv_layers(t.get("num_kv_shared_layers", 0))
    writer.add_embedding_length_per_layer_input(t.get("hidden_size_per_layer_input") or 0)
    swa = [kind == "sliding_attention" for kind in types]
    writer.add_sliding_window_pattern(swa)
    sliding, full = gemma_head_dims(t, tensors)
    writer.add_key_length(full)
    writer.add_value_length(full)
    writer.add_key_length_swa(sliding)
    writer.add_value_length_swa(sliding)
    kv = []  # per layer, from the k projections (one count when all agree)
    for i, kind in enumerate(types):
        end = f"layers.{i}.self_attn.k_proj.weight"
        k = next(w for key, w in tensors.items() if key.endswith(end))
        kv.append(k.shape[0] // (sliding if kind == "sliding_attention" else full))
    if len(set(kv)) > 1:
        writer.add_head_count_kv(kv)
    writer.add_rope_dimension_count(full)
    writer.add_rope_dimension_count_swa(sliding)


def write_vocab(writer: gguf.GGUFWriter, hf_dir: Path, vocab_size: int, config: dict) -> None:
    """The tiny tokenizer as a GPT-2 BPE vocabulary (module docstring)."""
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    by_id = {i: piece for piece, i in tok["model"]["vocab"].items()}
    special = {a["id"] for a in tok["added_tokens"] if a.get("special")}
    for a in tok["added_tokens"]:
        by_id[a["id"]] = a["content"]
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)]
    types = [gguf.TokenType.CONTROL if i in special else
             gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED
             for i in range(vocab_size)]  # fmt: skip
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("qwen35" if config["model_type"] == "qwen3_5" else "default")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    t = text_config(config)
    writer.add_eos_token_id(t["eos_token_id"])
    if t.get("pad_token_id") is not None:
        writer.add_pad_token_id(t["pad_token_id"])
    template = hf_dir / "chat_template.jinja"
    if template.is_file():
        writer.add_chat_template(template.read_text())
