"""Gemma 4's decoder layer (the dense text backbone of google/gemma-4-12B-it and -31B), and
its KV cache layout.

What differs from the Llama/Qwen layer (transformers' `Gemma4TextDecoderLayer` is the
reference):
- sliding-window layers (query q sees keys q - window < k <= q) and global layers, each
  kind with its own head dim, KV heads and RoPE (the global layers' "proportional" RoPE
  turns only the first quarter of a head's frequencies);
- q and k RMSNormed per head (scale w, not 1 + w), v normed without a scale, and attention
  scores not scaled (scale 1: the norms fix the logits' size); no attention softcapping;
- `attention_k_eq_v`: a global layer without v_proj takes its values from the key
  projection (before k_norm and RoPE);
- four norms per layer (before and after attention and the MLP), a GELU-tanh MLP (double
  wide on KV-shared layers with `use_double_wide_mlp`), and the whole output times a
  per-layer `layer_scalar`;
- KV sharing: the last `num_kv_shared_layers` layers project queries only and attend over
  the keys and values of the last earlier layer of their kind (the same cache slot).
Embedding scaling and the final logit softcapping live in `Transformer` (embed_tokens and
head), where drafters that borrow the target's embedding and head see them too.

The cache keeps every position of the sliding layers too, not a ring of `window`: rollback
by length and a chat's prefix reuse stay exact for free, and the static (graph-capturable)
path addresses keys by absolute position. The cost is memory: a 12B's sliding layers hold
the whole context instead of 1024 positions; attention still reads only the window (the
eager path slices it, the Triton kernel skips chunks before it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.config import FULL, ModelArgs
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.linear import linear
from specgen.kernels.qk_rope import apply_rope, qk_norm_rope
from specgen.kernels.rmsnorm import add_rms_norm, rms_norm
from specgen.models.blocks import new_weight, norm_weight
from specgen.models.kv_cache import StaticKVCache


class Gemma4Layer(nn.Module):
    """Layer `index` of a Gemma 4 text backbone; called like `DecoderLayer`."""

    def __init__(self, args: ModelArgs, index: int, dtype: torch.dtype, device: torch.device):
        super().__init__()
        g = args.gemma
        assert g is not None
        self.args, self.index = args, index
        h, nq = args.hidden_size, args.num_heads
        self.head_dim, self.kv_heads = d, nkv = g.head_dims[index], g.kv_heads[index]
        self.shared = g.shares_kv(index)  # no K/V of its own: its source layer's
        self.k_is_v = g.k_eq_v and g.layer_types[index] == FULL and not self.shared
        self.approximate = g.approximate
        self.q_rows = nq * d
        kv_rows = 0 if self.shared else nkv * d * (1 if self.k_is_v else 2)
        w, nw = dict(dtype=dtype, device=device), norm_weight(args, dtype, device)
        self.attn_norm, self.post_attn_norm = nw(h), nw(h)
        self.ffn_norm, self.post_ffn_norm = nw(h), nw(h)
        self.wqkv = new_weight(self.q_rows + kv_rows, h, **w)  # q, then k and v (if any)
        self.q_norm = nw(d)
        self.k_norm = None if self.shared else nw(d)
        self.wo = new_weight(h, nq * d, **w)
        inter = g.intermediate_sizes[index]
        self.w_gate_up = new_weight(2 * inter, h, **w)
        self.w_down = new_weight(h, inter, **w)
        # scales the layer's whole output; checkpoints may lack it (transformers: ones)
        self.layer_scalar = new_weight(1, **w)
        self.layer_scalar.data.fill_(1.0)

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
        return self._output(x, attention(q, keys, values, mask, causal, scale=1.0))

    def forward_static(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        positions: torch.Tensor,  # [T] int64, on the device
        length: torch.Tensor,  # [1] int32: positions[-1] + 1
        causal: bool = True,
        window: int | None = None,  # the sliding window (None: a global layer)
    ) -> torch.Tensor:  # [B, T, H]
        """`forward` with the positions in device memory (graph-capturable): keys are
        masked by `length` and the window instead of sliced."""
        q, kv = self._project(x, cos, sin)
        if kv is not None:
            cache.write_at(layer_id, positions, *kv)
        slot = cache.slot(layer_id)
        out = block_attention(q, cache.k[slot], cache.v[slot], length, causal, window, scale=1.0)
        return self._output(x, out)

    def _project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """q [B, nq, T, d] (normed, roped) and this layer's own (k, v) [B, n_kv, T, d]
        (None for a KV-shared layer)."""
        a, d, nkv = self.args, self.head_dim, self.kv_heads
        bsz, t, _ = x.shape
        nq, eps = a.num_heads, a.rms_norm_eps
        qkv = linear(rms_norm(x, self.attn_norm, eps), self.wqkv, None)
        if self.shared:
            q = rms_norm(qkv.view(bsz, t, nq, d), self.q_norm, eps)
            return apply_rope(q, cos, sin).transpose(1, 2), None
        rows = self.q_rows + nkv * d
        raw_v = qkv[..., self.q_rows : rows] if self.k_is_v else qkv[..., rows:]
        v = unit_rms_norm(raw_v.reshape(bsz, t, nkv, d), eps).transpose(1, 2)
        qk = qkv[..., :rows].view(bsz, t, nq + nkv, d)  # q and k heads: one norm + RoPE pass
        qk = qk_norm_rope(qk, nq, self.q_norm, self.k_norm, cos, sin, eps)
        return qk[:, :, :nq].transpose(1, 2), (qk[:, :, nq:].transpose(1, 2), v)

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:  # [B, T, H]
        """Projection, post-attention norm, residual, the MLP block, the layer scalar
        (`out`: the attention output [B, nq, T, d])."""
        bsz, t, _ = x.shape
        eps = self.args.rms_norm_eps
        out = linear(out.transpose(1, 2).reshape(bsz, t, -1), self.wo, None)
        h, x = add_rms_norm(rms_norm(out, self.post_attn_norm, eps), self.ffn_norm, eps, x)
        gate, up = linear(h, self.w_gate_up, None).chunk(2, dim=-1)
        mlp = linear(F.gelu(gate, approximate=self.approximate) * up, self.w_down, None)
        return (x + rms_norm(mlp, self.post_ffn_norm, eps)) * self.layer_scalar


def unit_rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm without a weight (Gemma 4's v_norm), statistics in fp32."""
    return F.rms_norm(x.float(), (x.shape[-1],), None, eps).to(x.dtype)


def new_gemma4_cache(
    args: ModelArgs, batch: int, capacity: int, *, dtype: torch.dtype, device: torch.device
) -> StaticKVCache:
    """One cache slot per layer with K/V of its own, shaped as that layer (sliding and global
    layers differ); a KV-shared layer maps to its source layer's slot. Every position is
    kept, sliding layers' included (see the module docstring)."""
    g = args.gemma
    assert g is not None
    own = [i for i in range(args.num_layers) if not g.shares_kv(i)]
    return StaticKVCache(
        num_layers=len(own),
        batch=batch,
        num_kv_heads=[g.kv_heads[i] for i in own],
        head_dim=[g.head_dims[i] for i in own],
        capacity=capacity,
        dtype=dtype,
        device=device,
        slots=[own.index(g.kv_source[i]) for i in range(args.num_layers)],
    )
