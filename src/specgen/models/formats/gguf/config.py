"""A config.json for a GGUF file, from its own key/values, for the architectures whose
config transformers cannot rebuild from a GGUF (`OWN_CONFIGS`).

transformers 5.25 rebuilds a Gemma 4 config from a GGUF with the defaults of another
model (head dim 256, per-layer embeddings, its own layer pattern), so specgen writes it
from the key/values llama.cpp's converter writes (`Gemma3Model`/`Gemma4Model.
set_gguf_parameters`).
"""

from __future__ import annotations

from specgen.core.errors import CheckpointError
from specgen.models.formats.gguf.reader import GGUFFile

OWN_CONFIGS = ("gemma4",)


def own_config(file: GGUFFile) -> dict | None:
    """The config of a file of `OWN_CONFIGS`' architectures (None for the others)."""
    if file.architecture not in OWN_CONFIGS:
        return None
    try:
        return _gemma4_config(file)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"{file.name}: not a readable Gemma 4 GGUF (metadata: {type(e).__name__}: {e})"
        ) from None


def _gemma4_config(file: GGUFFile) -> dict:
    def get(key: str, default=KeyError):
        key = key.replace("{arch}", "gemma4")
        if key not in file.meta:
            if default is KeyError:
                raise KeyError(key)
            return default
        return file.get(key)

    layers = int(get("{arch}.block_count"))
    sliding = [bool(x) for x in get("{arch}.attention.sliding_window_pattern")]
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    per_layer = lambda v: list(v) if isinstance(v, list) else [v] * layers  # noqa: E731
    kv = per_layer(get("{arch}.attention.head_count_kv"))
    widths = per_layer(get("{arch}.feed_forward_length"))
    head_dim = get("{arch}.attention.key_length_swa")
    global_dim = get("{arch}.attention.key_length")
    tensors = file.tensors
    first_full = types.index("full_attention") if "full_attention" in types else None
    first_sliding = types.index("sliding_attention") if "sliding_attention" in types else 0
    # a global layer without attn_v takes its values from the keys (attention_k_eq_v)
    k_eq_v = first_full is not None and f"blk.{first_full}.attn_v.weight" not in tensors
    partial = 0.25  # the share of a global head that turns: rope_freqs' entries of 1.0
    if "rope_freqs.weight" in tensors and tensors["rope_freqs.weight"].kind == "F32":
        import numpy as np

        freqs = file.data("rope_freqs.weight").view(np.float32)
        partial = 2 * int((freqs == 1.0).sum()) / global_dim
    if "tokenizer.ggml.tokens" not in file.meta:
        raise KeyError("tokenizer.ggml.tokens")
    config = {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "vocab_size": file.count("tokenizer.ggml.tokens"),
        "hidden_size": get("{arch}.embedding_length"),
        "intermediate_size": widths[0],
        "use_double_wide_mlp": len(set(widths)) > 1,
        "num_hidden_layers": layers,
        "num_attention_heads": get("{arch}.attention.head_count"),
        "num_key_value_heads": kv[first_sliding],
        "head_dim": head_dim,
        "global_head_dim": global_dim,
        "attention_k_eq_v": k_eq_v,
        "layer_types": types,
        "sliding_window": get("{arch}.attention.sliding_window"),
        "num_kv_shared_layers": get("{arch}.attention.shared_kv_layers", 0),
        "hidden_size_per_layer_input": get("{arch}.embedding_length_per_layer_input", 0),
        "rms_norm_eps": get("{arch}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": get("{arch}.context_length"),
        "final_logit_softcapping": get("{arch}.final_logit_softcapping", None),
        "hidden_activation": "gelu_pytorch_tanh",  # the file does not say; Gemma 4's
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": get("{arch}.rope.freq_base_swa"),
            },
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": partial,
                "rope_theta": get("{arch}.rope.freq_base"),
            },
        },
        "tie_word_embeddings": "output.weight" not in tensors,
        "eos_token_id": get("tokenizer.ggml.eos_token_id", None),
        "bos_token_id": get("tokenizer.ggml.bos_token_id", None),
        "pad_token_id": get("tokenizer.ggml.padding_token_id", None),
    }
    if first_full is not None and kv[first_full] != kv[first_sliding]:
        if k_eq_v:
            config["num_global_key_value_heads"] = kv[first_full]
        else:  # as transformers 5 writes per-layer shapes
            config["per_layer_config"] = {
                str(i): {"head_dim": global_dim, "num_key_value_heads": kv[i]}
                for i, t in enumerate(types)
                if t == "full_attention"
            }
    return config
