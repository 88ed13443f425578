"""A config.json for a GGUF file, from its own key/values (`OWN_CONFIGS`), so that the
first run reads the file once more for its tokenizer only.

The Llama-shaped architectures' config is what transformers 5.25 rebuilds from a GGUF
(`GGUF_CONFIG_MAPPING`: the sizes, RoPE base, norm epsilon, token ids; a head without
`output.weight` tied), except the head size, which it reads from the file
(`attention.key_length`, then `rope.dimension_count`) where transformers takes Qwen3's
default of 128. transformers rebuilds a Gemma 4 config with the defaults of another model
(head dim 256, per-layer embeddings, its own layer pattern), so specgen writes it from the
key/values llama.cpp's converter writes (`Gemma3Model`/`Gemma4Model.set_gguf_parameters`).
Qwen3.5's hybrid config still comes from transformers' reader. tests/test_gguf_reader.py
holds these to the checkpoints' own configs and to transformers'.
"""

from __future__ import annotations

from specgen.core.errors import CheckpointError
from specgen.models.formats.gguf.reader import GGUFFile

OWN_CONFIGS = ("llama", "qwen2", "qwen3", "gemma3", "gemma4")


def own_config(file: GGUFFile) -> dict | None:
    """The config of a file of `OWN_CONFIGS`' architectures (None for the others)."""
    arch = file.architecture
    if arch not in OWN_CONFIGS:
        return None
    try:
        if arch == "gemma3":
            return _gemma3_config(file)
        return _gemma4_config(file) if arch == "gemma4" else _llama_config(file, arch)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"{file.name}: not a readable {arch} GGUF (metadata: {type(e).__name__}: {e})"
        ) from None


def _llama_config(file: GGUFFile, arch: str) -> dict:
    def get(key: str, default=KeyError):
        key = key.replace("{arch}", arch)
        if key not in file.meta:
            if default is KeyError:
                raise KeyError(key)
            return default
        return file.get(key)

    heads = get("{arch}.attention.head_count")
    hidden = get("{arch}.embedding_length")
    head_dim = get("{arch}.attention.key_length", get("{arch}.rope.dimension_count", None))
    vocab = get("{arch}.vocab_size", None)
    if vocab is None:
        vocab = file.count("tokenizer.ggml.tokens")
    return {
        "model_type": arch,
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": get("{arch}.feed_forward_length"),
        "num_hidden_layers": get("{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": get("{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim if head_dim is not None else hidden // heads,
        "max_position_embeddings": get("{arch}.context_length"),
        "rms_norm_eps": get("{arch}.attention.layer_norm_rms_epsilon"),
        "rope_parameters": {"rope_type": "default",
                            "rope_theta": get("{arch}.rope.freq_base", 10000.0)},
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "bos_token_id": get("tokenizer.ggml.bos_token_id", None),
        "eos_token_id": get("tokenizer.ggml.eos_token_id", None),
        "pad_token_id": get("tokenizer.ggml.padding_token_id", None),
    }  # fmt: skip


def _gemma3_config(file: GGUFFile) -> dict:
    """What llama.cpp reads of a `gemma3` file (`Gemma3Model.set_gguf_parameters` writes it;
    llama-model.cpp's LLM_ARCH_GEMMA3 fills in the rest): sliding layers in a pattern of 6
    (every sixth global) with a local RoPE base of 10000, both fixed in llama.cpp, unless
    the file states a per-layer `sliding_window_pattern`; no `sliding_window` key means
    every layer is global; linear RoPE scaling on the global layers only; the attention
    scale 1/sqrt(head dim), except the 27B's (62 layers) 1/sqrt(hidden / heads), as
    llama.cpp does (gemma_pytorch's query_pre_attn_scalar). `<end_of_turn>` ends an
    answer too (llama.cpp marks it end-of-generation by its text)."""

    def get(key: str, default=KeyError):
        key = key.replace("{arch}", "gemma3")
        if key not in file.meta:
            if default is KeyError:
                raise KeyError(key)
            return default
        return file.get(key)

    layers = int(get("{arch}.block_count"))
    hidden, heads = int(get("{arch}.embedding_length")), int(get("{arch}.attention.head_count"))
    head_dim = int(get("{arch}.attention.key_length", hidden // heads))
    window = get("{arch}.attention.sliding_window", None)
    pattern = get("{arch}.attention.sliding_window_pattern", None)
    if window is None or window == 0:
        sliding = [False] * layers
    elif isinstance(pattern, list):
        sliding = [bool(x) for x in pattern]
    else:
        sliding = [bool((i + 1) % int(pattern or 6)) for i in range(layers)]
    tokens = file.strings("tokenizer.ggml.tokens")
    eos = get("tokenizer.ggml.eos_token_id", None)
    eos_ids = [] if eos is None else [eos]
    if "<end_of_turn>" in tokens and tokens.index("<end_of_turn>") not in eos_ids:
        eos_ids.append(tokens.index("<end_of_turn>"))
    full_rope = {"rope_type": "default", "rope_theta": get("{arch}.rope.freq_base", 1e6)}
    if get("{arch}.rope.scaling.type", None) == "linear":
        full_rope = {**full_rope, "rope_type": "linear",
                     "factor": get("{arch}.rope.scaling.factor")}  # fmt: skip
    return {
        "model_type": "gemma3_text",
        "architectures": ["Gemma3ForCausalLM"],
        "vocab_size": len(tokens),
        "hidden_size": hidden,
        "intermediate_size": get("{arch}.feed_forward_length"),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": get("{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "query_pre_attn_scalar": hidden // heads if layers == 62 else head_dim,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "sliding_window": window or None,
        "rms_norm_eps": get("{arch}.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": get("{arch}.context_length"),
        "final_logit_softcapping": get("{arch}.final_logit_softcapping", None),
        "attn_logit_softcapping": None,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": full_rope,
        },
        "tie_word_embeddings": "output.weight" not in file.tensors,
        "eos_token_id": eos_ids,
        "bos_token_id": get("tokenizer.ggml.bos_token_id", None),
        "pad_token_id": get("tokenizer.ggml.padding_token_id", None),
    }


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
