"""What llama.cpp's converter does to each architecture's tensors, undone.

`models/formats/gguf/index.py` names a GGUF file's tensors as the load plans do; this module says,
per `general.architecture`, which names the `gguf` package's map does not give and which
values the converter changed. Read from ggml-org/llama.cpp (`convert_hf_to_gguf.py` at
0024aa7417ef: `LlamaModel.permute`, `Qwen3NextModel.modify_tensors`,
`_LinearAttentionVReorderBase`, `Qwen3_5TextModel`; `conversion/base.py` at 00bd27a621f9:
`TextModel.filter_tensors` drops `language_model.`, `prepare_tensors` keeps 1-D tensors,
norms and `ssm_conv1d` F32; `conversion/gemma.py`'s `Gemma3Model`/`Gemma4Model`, in a
version whose commit the reading did not record (the one at 2bbcf7fc93a4 predates Gemma 4);
`src/llama-quant.cpp` at 007dbbf3fd17 quantizes only 2-D `*.weight` tensors, never norms or
`ssm_conv1d`):

- `llama`: q and k rows permuted (neighbours paired for RoPE instead of halves).
- `qwen2`, `qwen3`: names only.
- `qwen35` (Qwen3.5): the zero-centred norms stored as 1 + w, `ssm_a` = -exp(A_log): both
  what `Qwen3_5.finish_load` computes, so a file's values are taken as they are and that
  step is skipped (`finished`); `dt_bias` stored as `ssm_dt.bias`; the conv kernel
  squeezed to [C, K]; and where a key head serves several value heads, every value-head
  axis reordered from grouped (v0k0 v1k0 v0k1 v1k1) to tiled (v0k0 v0k1 v1k0 v1k1): the
  value rows of `attn_qkv` and `ssm_conv1d`, the rows of `attn_gate`, `ssm_alpha`,
  `ssm_beta`, `ssm_a`, `ssm_dt`, and the columns of `ssm_out`. Rows go back as whole rows;
  `ssm_out`'s columns cross quantization blocks, so it stays as stored and multiplies its
  input gathered (`PackedMatrix.columns`). A multi-token-prediction block, which newer
  converters export as `blk.<num_hidden_layers>` (`nextn_predict_layers`), is never read.
- `gemma3` (Gemma 3): every norm stored as 1 + w (`norm_shift`), what `Gemma3.finish_load`
  computes, so that step is skipped (`finished`); the embedding cut to the tokenizer's
  vocabulary (its rows past it are padding: the config's vocabulary is the file's);
  vision tensors left out (they go to the separate mmproj file).
- `gemma4` (Gemma 4): names only (its norms are stored as they are: `norm_shift` 0), the
  per-layer `layer_scalar` as `layer_output_scale.weight`, and an extra `rope_freqs` table
  (the proportional RoPE of the global layers, which specgen computes itself) unread.
"""

from __future__ import annotations

import torch

from specgen.core.config import ModelArgs
from specgen.models.formats.packed_matrix import PackedMatrix

Tensor = PackedMatrix | torch.Tensor

# architectures whose converter already applied what the family's finish_load does
FINISHED = ("qwen35", "gemma3")
# architectures whose files only this reader undoes (transformers 5.25 cannot dequantize
# them to safetensors), so `--dequantize` dequantizes what it loaded
OWN_LAYOUTS = ("qwen35", "gemma3", "gemma4")


def undo(arch: str, key: str, t: Tensor, args: ModelArgs) -> Tensor:
    """`t` (the file's tensor for plan key `key`) as the load plan wants it. A tensor of
    an unexpected shape is returned as it is: the loader's shape check names it."""
    if arch == "llama":
        return _undo_llama(key, t, args)
    if arch == "qwen35":
        return _undo_qwen35(key, t, args)
    return t


def _undo_llama(key: str, t: Tensor, args: ModelArgs) -> Tensor:
    heads = {"self_attn.q_proj.": args.num_heads, "self_attn.k_proj.": args.num_kv_heads}
    n = next((h for tag, h in heads.items() if tag in key), None)
    rows = t.shape[0]
    if n is None or rows % (2 * n):
        return t
    order = torch.arange(rows).view(n, rows // n // 2, 2).transpose(1, 2).reshape(rows)
    return _rows(t, order)


def grouped_from_tiled(key_heads: int, per_key: int, width: int = 1) -> torch.Tensor:
    """Index i of grouped order -> where llama.cpp's tiled order keeps it (`width` rows or
    columns per value head)."""
    tiled = torch.arange(key_heads * per_key * width).view(key_heads, per_key, width)
    return torch.argsort(tiled.transpose(0, 1).reshape(-1))


def _undo_qwen35(key: str, t: Tensor, args: ModelArgs) -> Tensor:
    hy = args.layout
    if hy is None or ".linear_attn." not in key:
        return t
    leaf = key.rsplit(".linear_attn.", 1)[1]
    if leaf == "conv1d.weight" and isinstance(t, PackedMatrix):
        t = t.dequantize()  # F32 in every file llama.cpp writes; a quantized one read whole
    per_key = hy.value_heads // hy.key_heads
    if per_key > 1:
        qk = 2 * hy.key_heads * hy.key_dim  # q and k rows come first, in order
        heads = grouped_from_tiled(hy.key_heads, per_key)
        values = grouped_from_tiled(hy.key_heads, per_key, hy.value_dim)
        rows = {
            "in_proj_qkv.weight": (qk, values),
            "conv1d.weight": (qk, values),
            "in_proj_z.weight": (0, values),
            "in_proj_a.weight": (0, heads),
            "in_proj_b.weight": (0, heads),
            "A_log": (0, heads),
            "dt_bias": (0, heads),
        }
        if leaf in rows:
            offset, order = rows[leaf]
            if t.shape[0] == offset + order.numel():
                t = _rows(t, torch.cat([torch.arange(offset), offset + order]))
        elif leaf == "out_proj.weight" and len(t.shape) == 2 and t.shape[1] == values.numel():
            t = t.permute_columns(values) if isinstance(t, PackedMatrix) else t[:, values]
    if leaf == "conv1d.weight" and t.dim() == 2:
        t = t.unsqueeze(1)  # [C, K] -> transformers' [C, 1, K]
    return t


def _rows(t: Tensor, order: torch.Tensor) -> Tensor:
    return t.permute_rows(order) if isinstance(t, PackedMatrix) else t[order]
