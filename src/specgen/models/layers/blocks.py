"""Pieces every decoder layer is built from: weights, RMSNorm weights, the MLP block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.rmsnorm import add_rms_norm
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.plans import Row


def norm_weight(args: ModelArgs, dtype: torch.dtype, device: torch.device):
    """RMSNorm weights: kept in fp32 where the family's norms scale in fp32 before rounding
    (Qwen3.5's zero-centred ones, Gemma 4's), as transformers does; else the model dtype."""
    dtype = torch.float32 if args.fp32_norms else dtype
    return lambda n: new_weight(n, dtype=dtype, device=device)


def add_mlp(layer: nn.Module, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
    """The post-attention norm and the SwiGLU MLP every decoder layer ends with."""
    h, inter, w = args.hidden_size, args.intermediate_size, dict(dtype=dtype, device=device)
    layer.ffn_norm = norm_weight(args, dtype, device)(h)
    layer.w_gate_up = DenseWeight(2 * inter, h, **w)
    layer.b_gate_up = new_weight(2 * inter, **w) if args.mlp_bias else None
    layer.w_down = DenseWeight(h, inter, **w)
    layer.b_down = new_weight(h, **w) if args.mlp_bias else None


def mlp_plan(layer: nn.Module, prefix: str, biased: bool = False):
    """The HF tensors of a gate/up/down MLP under `prefix` (gate and up stacked)."""
    h, inter = layer.w_down.shape[0], layer.w_down.shape[1]
    for kind in ("weight", "bias") if biased else ("weight",):
        fused = layer.w_gate_up if kind == "weight" else layer.b_gate_up
        down = layer.w_down if kind == "weight" else layer.b_down
        cols = (h,) if kind == "weight" else ()
        yield Row(prefix + f"mlp.gate_proj.{kind}", fused, (inter, *cols))
        yield Row(prefix + f"mlp.up_proj.{kind}", fused, (inter, *cols), offset=inter)
        yield Row(prefix + f"mlp.down_proj.{kind}", down, (h, inter) if cols else (h,))


def residual_mlp(layer: nn.Module, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """x + mixed, then the MLP block with its residual ([B, T, H]; `layer` from add_mlp)."""
    h, x = add_rms_norm(mixed, layer.ffn_norm, layer.args.rms_norm_eps, residual=x)
    return x + swiglu(layer, h)


def swiglu(layer: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The SwiGLU MLP alone, on the normed input ([B, T, H]; `layer` from add_mlp)."""
    gate, up = layer.w_gate_up(h, layer.b_gate_up).chunk(2, dim=-1)
    return layer.w_down(F.silu(gate) * up, layer.b_down)
