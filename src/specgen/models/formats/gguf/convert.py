"""GGUF checkpoints: their config and tokenizer cached as an HF directory, and for
`--dequantize` their weights too.

A GGUF target normally runs packed, straight from the file (models/formats/gguf/index.py): only its
config and tokenizer are converted, once, into `$SPECGEN_HOME/gguf/<name>-<key>/`.
`--dequantize` adds an fp32 `model.safetensors` to that directory (through transformers'
GGUF reader, tens of seconds even for a 135M model, so it is cached too). The key covers
the file's path, size and modification time, so a replaced file is converted again. Each
part is written to a temporary name and renamed into place, so an interrupted conversion
never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from specgen.core.errors import CheckpointError
from specgen.core.paths import specgen_home

# `general.architecture`s whose config specgen reads from the file itself: transformers
# 5.25 rebuilds a Gemma 4 config from a GGUF with the defaults of another model (head dim
# 256, per-layer embeddings, its own layer pattern); Qwen3.5's it rebuilds whole
OWN_CONFIGS = ("gemma4",)


def converted_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return specgen_home() / "gguf" / f"{gguf_path.stem}-{digest}"


def ensure_converted(
    gguf_path: Path, notify: Callable[[str], None] | None = None, *, weights: bool = False
) -> Path:
    """An HF-format directory with the GGUF's config and tokenizer (and, with `weights`,
    its dequantized fp32 weights)."""
    out = converted_dir(gguf_path)
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
        try:
            _convert_config(gguf_path, tmp)
            try:
                tmp.rename(out)
            except OSError:  # another process finished the same conversion first
                if not (out / "config.json").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    if weights and not (out / "model.safetensors").is_file():
        if notify:
            notify(f"dequantizing {gguf_path.name} to safetensors once (cached in {out.parent})")
        fd, tmp_file = tempfile.mkstemp(prefix=".tmp-", suffix=".safetensors", dir=out)
        os.close(fd)
        try:
            _convert_weights(gguf_path, Path(tmp_file))
            os.replace(tmp_file, out / "model.safetensors")
        finally:
            if os.path.exists(tmp_file):
                os.unlink(tmp_file)
    return out


def _config(gguf_path: Path):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:  # the reader raises ValueError/KeyError/struct errors alike
        raise CheckpointError(f"{gguf_path}: not a readable GGUF model ({e})") from None


def _convert_config(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    own = _own_config(gguf_path)
    if own is not None:
        (out / "config.json").write_text(json.dumps(own, indent=2) + "\n", encoding="utf-8")
    else:
        _config(gguf_path).save_pretrained(out)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except Exception as e:
        raise CheckpointError(f"{gguf_path}: cannot read the GGUF's tokenizer ({e})") from None
    tokenizer.save_pretrained(out)


def _convert_weights(gguf_path: Path, out_file: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    config = _config(gguf_path)
    # transformers maps GGUF tensor names by walking a model skeleton; a meta-device one
    # costs no memory and is used for nothing else.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    try:
        parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    except Exception as e:
        raise CheckpointError(f"{gguf_path}: cannot dequantise GGUF tensors ({e})") from None
    tensors = {k: v.float().contiguous() for k, v in parsed["tensors"].items()}
    save_file(tensors, str(out_file), metadata={"format": "pt"})


def _own_config(gguf_path: Path) -> dict | None:
    """A config.json for the architectures of OWN_CONFIGS, from the GGUF's key/values as
    llama.cpp's converter writes them (`Gemma3Model`/`Gemma4Model.set_gguf_parameters`)."""
    from specgen.models.formats.gguf.index import open_gguf

    reader = open_gguf(gguf_path, str(gguf_path))
    field = reader.get_field("general.architecture")
    if field is None or str(field.contents()) not in OWN_CONFIGS:
        return None
    try:
        return _gemma4_config(reader)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as e:
        raise CheckpointError(
            f"{gguf_path}: not a readable Gemma 4 GGUF (metadata: {type(e).__name__}: {e})"
        ) from None


def _gemma4_config(reader) -> dict:
    def get(key: str, default=KeyError):
        field = reader.get_field(key.format(arch="gemma4") if "{" in key else key)
        if field is None:
            if default is KeyError:
                raise KeyError(key.format(arch="gemma4"))
            return default
        return field.contents()

    import gguf

    k = gguf.Keys
    layers = int(get(k.LLM.BLOCK_COUNT))
    sliding = [bool(x) for x in get(k.Attention.SLIDING_WINDOW_PATTERN)]
    types = ["sliding_attention" if s else "full_attention" for s in sliding]
    per_layer = lambda v: list(v) if isinstance(v, list) else [v] * layers  # noqa: E731
    kv = per_layer(get(k.Attention.HEAD_COUNT_KV))
    widths = per_layer(get(k.LLM.FEED_FORWARD_LENGTH))
    head_dim, global_dim = get(k.Attention.KEY_LENGTH_SWA), get(k.Attention.KEY_LENGTH)
    tensors = {t.name: t for t in reader.tensors}
    first_full = types.index("full_attention") if "full_attention" in types else None
    first_sliding = types.index("sliding_attention") if "sliding_attention" in types else 0
    # a global layer without attn_v takes its values from the keys (attention_k_eq_v)
    k_eq_v = first_full is not None and f"blk.{first_full}.attn_v.weight" not in tensors
    partial = 0.25  # the share of a global head that turns: rope_freqs' entries of 1.0
    if "rope_freqs.weight" in tensors:
        freqs = tensors["rope_freqs.weight"].data
        partial = 2 * int((freqs == 1.0).sum()) / global_dim
    config = {
        "model_type": "gemma4_text",
        "architectures": ["Gemma4ForCausalLM"],
        "vocab_size": len(get(k.Tokenizer.LIST)),
        "hidden_size": get(k.LLM.EMBEDDING_LENGTH),
        "intermediate_size": widths[0],
        "use_double_wide_mlp": len(set(widths)) > 1,
        "num_hidden_layers": layers,
        "num_attention_heads": get(k.Attention.HEAD_COUNT),
        "num_key_value_heads": kv[first_sliding],
        "head_dim": head_dim,
        "global_head_dim": global_dim,
        "attention_k_eq_v": k_eq_v,
        "layer_types": types,
        "sliding_window": get(k.Attention.SLIDING_WINDOW),
        "num_kv_shared_layers": get(k.Attention.SHARED_KV_LAYERS, 0),
        "hidden_size_per_layer_input": get(k.LLM.EMBD_LENGTH_PER_LAYER_INP, 0),
        "rms_norm_eps": get(k.Attention.LAYERNORM_RMS_EPS),
        "max_position_embeddings": get(k.LLM.CONTEXT_LENGTH),
        "final_logit_softcapping": get(k.LLM.FINAL_LOGIT_SOFTCAPPING, None),
        "hidden_activation": "gelu_pytorch_tanh",  # the file does not say; Gemma 4's
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": get(k.Rope.FREQ_BASE_SWA)},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": partial,
                "rope_theta": get(k.Rope.FREQ_BASE),
            },
        },
        "tie_word_embeddings": "output.weight" not in tensors,
        "eos_token_id": get(k.Tokenizer.EOS_ID, None),
        "bos_token_id": get(k.Tokenizer.BOS_ID, None),
        "pad_token_id": get(k.Tokenizer.PAD_ID, None),
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
