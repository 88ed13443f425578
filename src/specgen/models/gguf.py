"""GGUF checkpoints, read with transformers' GGUF reader and cached as an HF directory.

Dequantising a GGUF through transformers takes tens of seconds even for a 135M model, so
the first load converts it once into `$SPECGEN_HOME/gguf/<name>-<key>/` (config.json,
fp32 model.safetensors, tokenizer files) and every later load is a plain safetensors load.
The key covers the file's path, size and modification time, so a replaced file is
converted again. The conversion is written to a temporary directory and renamed into
place, so an interrupted conversion never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from specgen.errors import CheckpointError
from specgen.paths import specgen_home


def converted_dir(gguf_path: Path) -> Path:
    st = gguf_path.stat()
    key = f"{gguf_path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return specgen_home() / "gguf" / f"{gguf_path.stem}-{digest}"


def ensure_converted(gguf_path: Path, notify: Callable[[str], None] | None = None) -> Path:
    """Return an HF-format directory holding the GGUF's config, weights and tokenizer."""
    out = converted_dir(gguf_path)
    if (out / "model.safetensors").is_file():
        return out
    if notify:
        notify(f"converting {gguf_path.name} to safetensors once (cached in {out.parent})")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
    try:
        _convert(gguf_path, tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same conversion first
            if not (out / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _convert(gguf_path: Path, out: Path) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, file = str(gguf_path.parent), gguf_path.name
    try:
        config = AutoConfig.from_pretrained(folder, gguf_file=file)
    except Exception as e:  # the reader raises ValueError/KeyError/struct errors alike
        raise CheckpointError(f"{gguf_path}: not a readable GGUF model ({e})") from None
    # transformers maps GGUF tensor names by walking a model skeleton; a meta-device one
    # costs no memory and is used for nothing else.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    try:
        parsed = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=skeleton)
    except Exception as e:
        raise CheckpointError(f"{gguf_path}: cannot dequantise GGUF tensors ({e})") from None
    tensors = {k: v.float().contiguous() for k, v in parsed["tensors"].items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=file).save_pretrained(out)
