"""The slow oracle for the DFlash drafter: one block's hidden states, recomputed from scratch.

No cache and no fused kernels: the context projections of every context token are
recomputed, keys of context and block are concatenated explicitly, attention is written
out with an explicit visibility mask and repeated K/V heads. `DFlashNet.extend` +
`block_hidden` (incremental, cached) must give the same numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specgen.kernels.qk_rope import apply_rope
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.layers.rope import rope_tables


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x32 = x.float()
    return (w.float() * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


@torch.no_grad()
def reference_block_hidden(
    net: DFlashNet,
    features: torch.Tensor,  # [1, L, K*H]: all context features, positions 0..L-1
    block: torch.Tensor,  # [1, B, H]: embedded [anchor, MASK...], positions L..L+B-1
) -> torch.Tensor:  # [1, B, H], after the final norm
    la = net.args.layers
    eps, nq, nkv, d = la.rms_norm_eps, la.num_heads, la.num_kv_heads, la.head_dim
    length, size = features.shape[1], block.shape[1]
    cos, sin = rope_tables(la.rope, d, length + size, dtype=block.dtype, device=block.device)
    ctx = _norm(F.linear(features, net.fc), net.hidden_norm, eps)
    x = block
    for i, layer in enumerate(net.layers):
        wq, wk, wv = layer.wqkv.dense().split([nq * d, nkv * d, nkv * d])
        h = _norm(x, layer.attn_norm, eps)
        q = _norm(F.linear(h, wq).view(1, size, nq, d), layer.q_norm, eps)
        k = F.linear(torch.cat([ctx, h], 1), wk).view(1, length + size, nkv, d)
        v = F.linear(torch.cat([ctx, h], 1), wv).view(1, length + size, nkv, d)
        k = _norm(k, layer.k_norm, eps)
        q = apply_rope(q, cos[length:], sin[length:]).transpose(1, 2)
        k = apply_rope(k, cos, sin).transpose(1, 2).repeat_interleave(nq // nkv, dim=1)
        v = v.transpose(1, 2).repeat_interleave(nq // nkv, dim=1)
        scores = q @ k.transpose(-1, -2) / d**0.5  # [1, nq, B, L+B]
        window, causal = net.args.windows[i], net.args.causal[i]
        offset = torch.arange(length, length + size)[:, None] - torch.arange(length + size)
        if causal:  # a block slot sees no later slot
            scores = scores.masked_fill(offset < 0, float("-inf"))
        if window is not None:
            scores = scores.masked_fill(offset.abs() >= window, float("-inf"))
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, size, nq * d)
        x = x + F.linear(out, layer.wo.dense())
        gate, up = F.linear(_norm(x, layer.ffn_norm, eps), layer.w_gate_up.dense()).chunk(2, -1)
        x = x + F.linear(F.silu(gate) * up, layer.w_down.dense())
    return _norm(x, net.norm, eps)
