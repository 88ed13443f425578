"""GGUF checkpoints: their config and tokenizer cached as an HF directory, and for
`--dequantize` their weights too.

A GGUF target normally runs packed, straight from the file (models/formats/gguf/index.py): only its
config and tokenizer are converted, once, into `$SPECGEN_HOME/gguf/<name>-<key>/` (the
first run announces it with its duration: core/once.py). The file's header is read first
(models/formats/gguf/reader.py), so a broken file or one of an architecture specgen does
not run is refused before any conversion starts.
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
from specgen.core.once import building
from specgen.core.paths import specgen_home
from specgen.models.formats.gguf.config import own_config
from specgen.models.formats.gguf.names import open_gguf


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
        file = open_gguf(gguf_path, str(gguf_path))  # refused here if it is not one we run
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=out.parent))
        try:
            with building(f"{gguf_path.name}'s config and tokenizer", out.parent):
                _convert_config(gguf_path, file, tmp)
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


# architectures whose transformers tokenizer class is SentencePiece-shaped (Gemma's), which
# cannot encode with a byte-level BPE vocabulary: llama.cpp's Gemma3Model writes one
# (`tokenizer.ggml.model` "gpt2") for a checkpoint that ships tokenizer.json without
# tokenizer.model, so such a file's tokenizer is read as the generic fast tokenizer
SENTENCEPIECE_CLASSES = ("gemma3",)


def _convert_config(gguf_path: Path, file, out: Path) -> None:
    own = own_config(file)  # a broken file of ours is refused before transformers loads
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if own is not None:
        (out / "config.json").write_text(json.dumps(own, indent=2) + "\n", encoding="utf-8")
    else:
        _config(gguf_path).save_pretrained(out)
    byte_level = file.get("tokenizer.ggml.model") == "gpt2"
    reader = (
        PreTrainedTokenizerFast
        if byte_level and file.architecture in SENTENCEPIECE_CLASSES
        else AutoTokenizer
    )
    try:
        tokenizer = reader.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
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
