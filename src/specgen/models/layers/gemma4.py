"""Gemma 4's decoder layer: the one layer of Gemma 4 targets (google/gemma-4-12B-it, -31B),
of DeepSpec's Gemma 4 drafters (`Gemma4DSparkModel`) and of Gemma 3 targets, each shaped by
a `GemmaShape`.

What differs from the Llama-shaped layer (transformers' `Gemma4TextDecoderLayer` is the
reference):
- each layer has its own head dim and KV heads (sliding-window and global layers differ;
  a drafter's layers take the global shape);
- q and k RMSNormed per head (scale w, not 1 + w), v normed without a scale, attention
  scores not scaled (scale 1: the norms fix the logits' size); no attention softcapping;
- `k_is_v`: a global layer without v_proj takes its values from the key projection (before
  k_norm and RoPE);
- four norms (before and after attention and the MLP, weights in fp32: Gemma scales in fp32
  and rounds once), a GELU MLP, and the whole output times a per-layer `layer_scalar`;
- `shared`: a KV-shared layer projects queries only and attends over the keys and values
  already in its cache slot (an earlier layer's).
Keys and values of a drafter's context come from the same projections (`project_kv`).
Gemma 3's layer (transformers' `Gemma3DecoderLayer`) is the same four-norm GELU layer but
for three `GemmaShape` fields: no v norm (`v_norm`), scores scaled by query_pre_attn_scalar
** -0.5 (`scale`), no layer scalar (`scalar`); its norms' 1 + w the family adds to the
weights once (families/gemma3.py), so the arithmetic here is unchanged.
DeepSpec's Gemma 4 EAGLE-3 layer (`Gemma4Eagle3DecoderLayer`) is this layer with q/k/v
reading 2H (`in_features`: its two normed halves, `qkv_of`) and the hidden input as the
residual.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.qk_rope import apply_rope, qk_norm_rope
from specgen.kernels.rmsnorm import add_rms_norm, rms_norm
from specgen.models.cache.kv import StaticKVCache
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.plans import Row

GELU = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}  # hidden_activation -> F.gelu's form


@dataclass(frozen=True)
class GemmaShape:
    """One Gemma layer's shape."""

    hidden: int
    heads: int
    head_dim: int
    kv_heads: int
    intermediate: int  # the MLP's width (double on a KV-shared layer with a double-wide MLP)
    eps: float
    shared: bool = False  # no K/V of its own: it reads its cache slot (an earlier layer's)
    k_is_v: bool = False  # values are the key projection (no v_proj)
    approximate: str = "tanh"  # the MLP's GELU, F.gelu's form
    v_norm: bool = True  # values RMSNormed without a scale (Gemma 4; not Gemma 3)
    scale: float = 1.0  # of the attention scores (Gemma 3: query_pre_attn_scalar ** -0.5)
    scalar: bool = True  # a `layer_scalar` on the output (Gemma 4; Gemma 3 has none)

    @property
    def kv_rows(self) -> int:  # rows of its own k (and v) projection in the fused matrix
        return 0 if self.shared else self.kv_heads * self.head_dim * (1 if self.k_is_v else 2)


def gemma_mlp_widths(intermediate: int, layers: int, shared: int, double_wide: bool):
    """Each layer's MLP width, transformers' Gemma4TextMLP rule: the layers at or past
    num_layers - num_kv_shared_layers (when that is > 0) are KV-shared and, under
    `use_double_wide_mlp`, twice as wide."""
    first = layers - shared
    return tuple(intermediate * (2 if double_wide and i >= first > 0 else 1) for i in range(layers))


class GemmaLayer(nn.Module):
    """Called like the Llama-shaped `DecoderLayer`."""

    def __init__(
        self,
        shape: GemmaShape,
        dtype: torch.dtype,
        device: torch.device,
        in_features: int | None = None,  # q/k/v's input width (EAGLE-3's layers: 2H)
    ) -> None:
        super().__init__()
        s = self.shape = shape
        h, d = s.hidden, s.head_dim
        self.in_features = in_features or h
        self.q_rows = s.heads * d
        w, norm = dict(dtype=dtype, device=device), dict(dtype=torch.float32, device=device)
        self.attn_norm, self.post_attn_norm = new_weight(h, **norm), new_weight(h, **norm)
        self.ffn_norm, self.post_ffn_norm = new_weight(h, **norm), new_weight(h, **norm)
        # q, then k and v (if any)
        self.wqkv = DenseWeight(self.q_rows + s.kv_rows, self.in_features, **w)
        self.q_norm = new_weight(d, **norm)
        self.k_norm = None if s.shared else new_weight(d, **norm)
        self.wo = DenseWeight(h, s.heads * d, **w)
        self.w_gate_up = DenseWeight(2 * s.intermediate, h, **w)
        self.w_down = DenseWeight(h, s.intermediate, **w)
        # scales the layer's whole output; checkpoints may lack it (transformers: ones)
        self.layer_scalar = new_weight(1, **w) if s.scalar else None
        if self.layer_scalar is not None:
            self.layer_scalar.data.fill_(1.0)

    def plan(self, prefix: str) -> Iterator[Row]:
        """The checkpoint's tensors of this layer (transformers' and DeepSpec's names agree).
        A KV-shared layer has no k/v of its own (published copies are ignored)."""
        s, p, h, n = self.shape, prefix, self.shape.hidden, self.in_features
        kv, inter = s.kv_heads * s.head_dim, s.intermediate
        yield Row(p + "input_layernorm.weight", self.attn_norm, (h,))
        yield Row(p + "self_attn.q_proj.weight", self.wqkv, (self.q_rows, n))
        if not s.shared:
            yield Row(p + "self_attn.k_proj.weight", self.wqkv, (kv, n), self.q_rows)
            yield Row(p + "self_attn.k_norm.weight", self.k_norm, (s.head_dim,))
        if not s.shared and not s.k_is_v:
            yield Row(p + "self_attn.v_proj.weight", self.wqkv, (kv, n), self.q_rows + kv)
        yield Row(p + "self_attn.q_norm.weight", self.q_norm, (s.head_dim,))
        yield Row(p + "self_attn.o_proj.weight", self.wo, (h, self.q_rows))
        yield Row(p + "post_attention_layernorm.weight", self.post_attn_norm, (h,))
        yield Row(p + "pre_feedforward_layernorm.weight", self.ffn_norm, (h,))
        yield Row(p + "mlp.gate_proj.weight", self.w_gate_up, (inter, h))
        yield Row(p + "mlp.up_proj.weight", self.w_gate_up, (inter, h), inter)
        yield Row(p + "mlp.down_proj.weight", self.w_down, (h, inter))
        yield Row(p + "post_feedforward_layernorm.weight", self.post_ffn_norm, (h,))
        if s.scalar:
            yield Row(p + "layer_scalar", self.layer_scalar, (1,), optional=True)

    def project_kv(
        self,
        h: torch.Tensor,  # [B, T, H]: inputs that serve only as keys (a drafter's context)
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # k, v: [B, n_kv, T, d]
        s = self.shape
        bsz, t, _ = h.shape
        rows = self.wqkv(h, rows=slice(self.q_rows, None))
        k = rows[..., : s.kv_heads * s.head_dim].view(bsz, t, s.kv_heads, s.head_dim)
        v = k if s.k_is_v else rows[..., s.kv_heads * s.head_dim :].view_as(k)
        k = apply_rope(rms_norm(k, self.k_norm, s.eps), cos, sin)
        v = unit_rms_norm(v, s.eps) if s.v_norm else v
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d] of this layer's kind
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        mask: torch.Tensor | None,  # over the last mask.shape[-1] keys (Transformer's mask)
        causal: bool,
    ) -> torch.Tensor:  # [B, T, H]
        q, kv = self._project(x, cos, sin)
        keys, values = cache.written(layer_id) if kv is None else cache.write(layer_id, *kv)
        if mask is not None:  # a sliding window's mask starts at its first visible key
            lo = keys.shape[2] - mask.shape[-1]
            keys, values = keys[:, :, lo:], values[:, :, lo:]
        return self._output(x, attention(q, keys, values, mask, causal, scale=self.shape.scale))

    def forward_static(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        positions: torch.Tensor,  # [T] int64, on the device
        length: torch.Tensor,  # [1] int32: positions[-1] + 1
        causal: bool = True,  # False: every query sees every key (a drafter's block)
        window: int | None = None,  # the sliding window (None: a global layer)
    ) -> torch.Tensor:  # [B, T, H]
        """`forward` with the positions in device memory (graph-capturable): keys are
        masked by `length` and the window instead of sliced."""
        q, kv = self._project(x, cos, sin)
        if kv is not None:
            cache.write_at(layer_id, positions, *kv)
        slot = cache.slot(layer_id)
        k, v, scale = cache.k[slot], cache.v[slot], self.shape.scale
        out = block_attention(q, k, v, length, causal, window, scale=scale)
        return self._output(x, out)

    def _project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """q [B, nq, T, d] (normed, roped) and this layer's own (k, v) [B, n_kv, T, d]
        (None for a KV-shared layer)."""
        return self.qkv_of(rms_norm(x, self.attn_norm, self.shape.eps), cos, sin)

    def qkv_of(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """`_project` of an input already normed ([B, T, in_features]): EAGLE-3's layer
        feeds cat(input_layernorm(embedding), hidden_norm(hidden))."""
        s = self.shape
        d, nq, nkv, eps = s.head_dim, s.heads, s.kv_heads, s.eps
        bsz, t, _ = h.shape
        qkv = self.wqkv(h)
        if s.shared:
            q = rms_norm(qkv.view(bsz, t, nq, d), self.q_norm, eps)
            return apply_rope(q, cos, sin).transpose(1, 2), None
        rows = self.q_rows + nkv * d
        raw_v = qkv[..., self.q_rows : rows] if s.k_is_v else qkv[..., rows:]
        v = raw_v.reshape(bsz, t, nkv, d)
        v = (unit_rms_norm(v, eps) if s.v_norm else v).transpose(1, 2)
        qk = qkv[..., :rows].view(bsz, t, nq + nkv, d)  # q and k heads: one norm + RoPE pass
        qk = qk_norm_rope(qk, nq, self.q_norm, self.k_norm, cos, sin, eps)
        return qk[:, :, :nq].transpose(1, 2), (qk[:, :, nq:].transpose(1, 2), v)

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        """Projection, post-attention norm, residual, the MLP block, the layer scalar
        (`out`: the attention output [B, nq, T, d])."""
        bsz, t, _ = x.shape
        eps = self.shape.eps
        out = self.wo(out.transpose(1, 2).reshape(bsz, t, -1))
        h, x = add_rms_norm(rms_norm(out, self.post_attn_norm, eps), self.ffn_norm, eps, x)
        gate, up = self.w_gate_up(h).chunk(2, dim=-1)
        mlp = self.w_down(F.gelu(gate, approximate=self.shape.approximate) * up)
        out = x + rms_norm(mlp, self.post_ffn_norm, eps)
        return out if self.layer_scalar is None else out * self.layer_scalar


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (Gemma 4's v_norm), statistics in fp32."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)
