"""Pieces every decoder layer is built from: weights, RMSNorm weights, the MLP block."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.config import ModelArgs
from specgen.kernels.linear import linear
from specgen.kernels.rmsnorm import add_rms_norm


def new_weight(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def norm_weight(args: ModelArgs, dtype: torch.dtype, device: torch.device):
    """RMSNorm weights: zero-centred ones (Qwen3.5: the scale 1 + w, added at load time)
    and Gemma 4's are kept in fp32, so the norm scales in fp32 before rounding, as
    transformers does for these families."""
    dtype = torch.float32 if args.norm_offset or args.gemma is not None else dtype
    return lambda n: new_weight(n, dtype=dtype, device=device)


def add_mlp(layer: nn.Module, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
    """The post-attention norm and the SwiGLU MLP every decoder layer ends with."""
    h, inter, w = args.hidden_size, args.intermediate_size, dict(dtype=dtype, device=device)
    layer.ffn_norm = norm_weight(args, dtype, device)(h)
    layer.w_gate_up = new_weight(2 * inter, h, **w)
    layer.b_gate_up = new_weight(2 * inter, **w) if args.mlp_bias else None
    layer.w_down = new_weight(h, inter, **w)
    layer.b_down = new_weight(h, **w) if args.mlp_bias else None


def residual_mlp(layer: nn.Module, x: torch.Tensor, mixed: torch.Tensor) -> torch.Tensor:
    """x + mixed, then the MLP block with its residual ([B, T, H]; `layer` from add_mlp)."""
    h, x = add_rms_norm(mixed, layer.ffn_norm, layer.args.rms_norm_eps, residual=x)
    gate, up = linear(h, layer.w_gate_up, layer.b_gate_up).chunk(2, dim=-1)
    return x + linear(F.silu(gate) * up, layer.w_down, layer.b_down)
