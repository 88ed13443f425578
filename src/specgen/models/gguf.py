"""GGUF checkpoints: their config and tokenizer cached as an HF directory, and for
`--dequantize` their weights too.

A GGUF target normally runs packed, straight from the file (models/gguf_index.py): only its
config and tokenizer are converted, once, into `$SPECGEN_HOME/gguf/<name>-<key>/`.
`--dequantize` adds an fp32 `model.safetensors` to that directory (through transformers'
GGUF reader, tens of seconds even for a 135M model, so it is cached too). The key covers
the file's path, size and modification time, so a replaced file is converted again. Each
part is written to a temporary name and renamed into place, so an interrupted conversion
never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import os
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
