"""GGUF blocks and tiny GGUF targets for the packed-weight tests, written with the `gguf`
package in the layout llama.cpp's converter writes (support/llamacpp_convert.py: tensor names from
gguf's own name map, and each architecture's transforms)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from support.llamacpp_convert import (
    ARCH,
    Converter,
    file_kind,
    text_config,
    text_tensors,
    write_metadata,
    write_vocab,
)

QUANTIZERS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0")  # gguf.quants.quantize has these
ALL_KINDS = (*QUANTIZERS, "Q4_K", "Q5_K", "Q6_K")
# where each format keeps its fp16 fields: (byte offset in the block, count)
HALVES = {"Q4_0": (0, 1), "Q4_1": (0, 2), "Q5_0": (0, 1), "Q5_1": (0, 2), "Q8_0": (0, 1),
          "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, 1)}  # fmt: skip


def qtype(kind: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[kind]


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, *,
                  scale: float = 1e-3, halves: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Random bytes in `kind`'s layout [rows, bytes per row], every integer field uniform over
    its whole range; the fp16 scales drawn around `scale` (or given as `halves`)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype(kind)]
    data = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    at, count = HALVES[kind]
    if halves is None:
        halves = (rng.uniform(0.25, 1.0, (rows, cols // block, count)) * scale).astype(np.float16)
    data[..., at : at + 2 * count] = (
        halves.astype(np.float16).view(np.uint8).reshape(rows, cols // block, 2 * count)
    )
    return data.reshape(rows, -1)


def dequantized(kind: str, data: np.ndarray) -> np.ndarray:
    return gguf.quants.dequantize(data, qtype(kind))


def write_tiny_gguf(hf_dir: Path, out: Path, kinds: dict[str, str], *, seed: int = 0,
                    mtp: int = 0) -> Path:  # fmt: skip
    """`hf_dir`'s tiny model as a GGUF file at `out` in llama.cpp's layout (llamacpp_convert:
    its names, transforms, metadata and tokenizer), each 2-D weight in the kind of the first
    `kinds` key its GGUF name contains ("" matches all; what llama.cpp keeps F32 stays F32).
    `mtp`: that many multi-token-prediction blocks after the decoder's, as newer converters
    export Qwen3.5's (`blk.<num_hidden_layers + i>`, the last layer's tensors and `nextn.*`
    ones; `block_count` counts them, `nextn_predict_layers` says how many).
    Returns a directory like `hf_dir` whose safetensors hold what the GGUF file defines
    (its dequantized weights, the converter's transforms undone): the dense oracle."""
    config = json.loads((hf_dir / "config.json").read_text())
    arch, text = config["model_type"], text_config(config)
    tensors = load_file(str(hf_dir / "model.safetensors"))
    names = gguf.get_tensor_name_map(ARCH[arch], text["num_hidden_layers"])
    arch = "gemma3" if arch == "gemma3_text" else arch
    convert = Converter(arch, text, names)
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(out), gguf.MODEL_ARCH_NAMES[ARCH[arch]])
    write_metadata(writer, arch, config, tensors, mtp=mtp)
    write_vocab(writer, hf_dir, text["vocab_size"], config)
    oracle, last = {}, f"blk.{text['num_hidden_layers'] - 1}."
    for hf, name in text_tensors(tensors).items():
        gg, w = convert.convert(name, tensors[hf].float().numpy())
        kind = file_kind(gg, w.shape, kinds)
        if kind is None:
            writer.add_tensor(gg, np.ascontiguousarray(w, dtype=np.float32))
            back = w
        elif kind == "F16":
            writer.add_tensor(gg, np.ascontiguousarray(w, dtype=np.float16))
            back = w.astype(np.float16).astype(np.float32)
        else:
            if kind in QUANTIZERS:
                data = gguf.quants.quantize(w, qtype(kind))
            else:  # no K-quant quantizer in gguf: a random matrix in that layout
                data = random_blocks(kind, *w.shape, rng, scale=2e-4)
            writer.add_tensor(gg, data, raw_dtype=qtype(kind))
            back = dequantized(kind, data)
        oracle[hf] = torch.from_numpy(np.ascontiguousarray(convert.unconvert(name, back)))
        for i in range(mtp) if gg.startswith(last) else ():  # copies, never read
            copy = gg.replace(last, f"blk.{text['num_hidden_layers'] + i}.")
            writer.add_tensor(copy, np.ascontiguousarray(w, dtype=np.float32))
    for i in range(mtp):
        h = text["hidden_size"]
        block = f"blk.{text['num_hidden_layers'] + i}.nextn."
        writer.add_tensor(block + "eh_proj.weight", rng.standard_normal((h, 2 * h), np.float32))
        for norm in ("enorm", "hnorm", "shared_head_norm"):
            writer.add_tensor(block + norm + ".weight", np.ones(h, np.float32))
    for gg, w in convert.extra_tensors(tensors).items():
        writer.add_tensor(gg, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    dense = out.parent / f"{out.stem}-dequantized"
    dense.mkdir(exist_ok=True)
    for f in hf_dir.iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            (dense / f.name).write_bytes(f.read_bytes())
    save_file(oracle, str(dense / "model.safetensors"))
    return dense


FAMILY_MIXES = {  # as llama.cpp files mix formats (a Q4_K_M keeps ffn_down and attn_v in Q6_K)
    "q8_0": {"": "Q8_0"},
    "q4_1": {"token_embd": "Q8_0", "": "Q4_1"},
    "q5": {"ssm_out": "Q5_0", "attn_k": "Q5_0", "": "Q5_1"},
    "q4_k_m": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_qkv": "Q6_K", "attn_q": "Q5_K",
               "": "Q4_K"},
    # the same with Q8_0 where a row is not whole 256-blocks (transformers has no Q5_0)
    "q4_k": {"attn_output": "Q8_0", "attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_q": "Q5_K",
             "": "Q4_K"},
}  # fmt: skip


LLAMA_MIXES = {  # how llama.cpp files mix formats: a Q4_K_M keeps attn_v and ffn_down in Q6_K
    "q4_1": {"token_embd": "Q8_0", "": "Q4_1"},
    "q4_0": {"": "Q4_0"},
    "q8_0": {"": "Q8_0"},
    "q5": {"attn_k": "Q5_0", "": "Q5_1"},
    "q4_k_m": {"attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_q": "Q5_K", "": "Q4_K"},
}
