"""A DFlash 2 drafter layer: DFlash's Qwen3-style layer with a grouped dynamic causal
convolution around its attention and around its MLP (z-lab's `GroupedDynamicCausalConv`,
PyPI `dflash` 0.1.0).

Each convolution has `base_kernel` [2, K, H] (one static kernel per side) and
`kernel_projection` H -> 2*K*G (G = H / group_size): per block token, dynamic coefficients
for both sides, one per channel group. `prepare` runs on the normed sublayer input: it
computes the coefficients, convolves the input with side 0 and keeps side 1; `finish`
convolves the sublayer's output with side 1. The convolution is

    out[t, c] = sum_o (base[o, c] + dyn[t, o, group(c)]) * x[t - o, c]

over the draft block only (zero before slot 0: the context features are not convolved,
they still enter as K/V only). It is causal, so a shorter block's slots are the full
block's where attention lets them be.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.kv import StaticKVCache
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.layers.blocks import swiglu
from specgen.models.layers.decoder import DecoderLayer
from specgen.models.plans import Row


class DynamicConv(nn.Module):
    def __init__(
        self, hidden: int, kernel: int, group: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.kernel, self.group, self.groups = kernel, group, hidden // group
        self.base = new_weight(2, kernel, hidden, dtype=dtype, device=device)
        self.projection = DenseWeight(2 * kernel * self.groups, hidden, dtype=dtype, device=device)

    def plan(self, prefix: str) -> Iterator[Row]:
        h = self.base.shape[-1]
        yield Row(prefix + "base_kernel", self.base, (2, self.kernel, h))
        yield Row(
            prefix + "kernel_projection.weight", self.projection, (2 * self.kernel * self.groups, h)
        )

    def prepare(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Side 0 applied to the normed input [B, T, H]; side 1's coefficients kept."""
        dyn = self.projection(h).view(*h.shape[:-1], 2, self.kernel, self.groups)
        return self._convolve(h, dyn[..., 0, :, :], 0), dyn[..., 1, :, :]

    def finish(self, y: torch.Tensor, dyn: torch.Tensor) -> torch.Tensor:
        return self._convolve(y, dyn, 1)

    def _convolve(self, x: torch.Tensor, dyn: torch.Tensor, side: int) -> torch.Tensor:
        """x [B, T, H], dyn [B, T, K, G]: the static and dynamic taps added in the
        reference's order (same rounding)."""
        bsz, t, h = x.shape
        blocks = x.view(bsz, t, self.groups, self.group)
        dyn = dyn.reshape(bsz, t, self.kernel, self.groups, 1)
        out = torch.zeros_like(blocks)
        for o in range(self.kernel):
            shifted = blocks if o == 0 else F.pad(blocks[:, : t - o], (0, 0, 0, 0, o, 0))
            out = out + self.base[side, o].view(1, 1, self.groups, self.group) * shifted
            out = torch.addcmul(out, dyn[:, :, o], shifted)
        return out.view(bsz, t, h)


class ConvDecoderLayer(DecoderLayer):
    """`DecoderLayer` with `attention_conv` and `mlp_conv`. Context K/V (`project_kv`)
    are unchanged: the convolutions act on the block alone."""

    def __init__(
        self,
        args: ModelArgs,
        kernel: int,
        group: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__(args, dtype, device)
        self.attention_conv = DynamicConv(args.hidden_size, kernel, group, dtype, device)
        self.mlp_conv = DynamicConv(args.hidden_size, kernel, group, dtype, device)

    def plan(self, prefix: str) -> Iterator[Row]:
        yield from super().plan(prefix)
        yield from self.attention_conv.plan(prefix + "attention_conv.")
        yield from self.mlp_conv.plan(prefix + "mlp_conv.")

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer_id: int,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        q, k, v, side = self._conv_qkv(x, cos, sin)
        keys, values = cache.write(layer_id, k, v)
        return self._conv_output(x, attention(q, keys, values, mask, causal), side)

    def forward_static(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer_id: int,
        positions: torch.Tensor,
        length: torch.Tensor,
        causal: bool = True,
        window: int | None = None,
    ) -> torch.Tensor:
        q, k, v, side = self._conv_qkv(x, cos, sin)
        cache.write_at(layer_id, positions, k, v)
        slot = cache.slot(layer_id)
        out = block_attention(q, cache.k[slot], cache.v[slot], length, causal, window)
        return self._conv_output(x, out, side)

    def _conv_qkv(self, x, cos, sin):
        h, side = self.attention_conv.prepare(rms_norm(x, self.attn_norm, self.args.rms_norm_eps))
        q, k, v, _ = self.qkv_of(h, cos, sin)  # DFlash layers have no output gate
        return q, k, v, side

    def _conv_output(self, x: torch.Tensor, out: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        """o_proj, side 1 of the attention conv, residual; then the MLP inside its conv."""
        bsz, t, _ = x.shape
        mixed = self.wo(out.transpose(1, 2).reshape(bsz, t, -1), self.bo)
        x = x + self.attention_conv.finish(mixed, side)
        h, side = self.mlp_conv.prepare(rms_norm(x, self.ffn_norm, self.args.rms_norm_eps))
        return x + self.mlp_conv.finish(swiglu(self, h), side)
