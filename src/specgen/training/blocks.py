"""Training blocks for DFlash / DSpark drafters, built exactly as inference builds them.

A training sequence is prompt + response token ids with the target's hidden states at the
drafter's tap layers for every position. An anchor a is a committed position; its block is
[ids[a], MASK x (B-1)] at positions a .. a+B-1, attending to the context features of
positions < a and, non-causally, to its own block (`models/drafters/dflash.py`). DFlash slot k
(1..B-1) is trained on ids[a+k]; DSpark's anchor-first slot k (0..B-1) on ids[a+k+1].

`block_forward` runs many anchors of one sequence in a single differentiable pass: every
block's queries see the shared context keys before their own anchor and the keys of their
own block only. For one anchor it equals the cached inference path (`DFlashNet.extend` +
`block_hidden`), which tests/test_training_blocks.py checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specgen.kernels.qk_rope import apply_rope
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.drafters.dflash import DFlashNet
from specgen.models.layers.rope import rope_tables


@dataclass(frozen=True)
class Blocks:
    anchors: torch.Tensor  # [A] positions of the anchors
    inputs: torch.Tensor  # [A, B] token ids: anchor, then MASK
    targets: torch.Tensor  # [A, S] the token each draft slot is trained on (-1: none)
    first_slot: int  # 1 for DFlash (slot 0 is the anchor), 0 for DSpark (anchor-first)


def make_blocks(
    ids: torch.Tensor,  # [N]
    anchors: torch.Tensor,  # [A]
    *,
    block_size: int,
    mask_token_id: int,
    anchor_first: bool,
) -> Blocks:
    """Inputs and per-slot targets; slots whose target lies past the sequence get -1."""
    n = ids.shape[0]
    offsets = torch.arange(block_size, device=ids.device)
    inputs = torch.full((anchors.shape[0], block_size), mask_token_id, device=ids.device)
    inputs[:, 0] = ids[anchors]
    first = 0 if anchor_first else 1
    slots = offsets[first:]
    positions = anchors[:, None] + slots[None, :] + (1 if anchor_first else 0)
    targets = torch.where(positions < n, ids[positions.clamp(max=n - 1)], -1)
    return Blocks(anchors, inputs, targets, first)


def block_forward(
    net: DFlashNet,
    features: torch.Tensor,  # [N, K*H] target hidden states of the whole sequence
    block_embeds: torch.Tensor,  # [A, B, H] embedded block inputs
    anchors: torch.Tensor,  # [A]
) -> torch.Tensor:  # [A, B, H] hidden states after the drafter's final norm
    """All blocks of one sequence in one pass (differentiable; for training)."""
    la = net.args.layers
    eps, nq, nkv, d = la.rms_norm_eps, la.num_heads, la.num_kv_heads, la.head_dim
    n, (a, b, h) = features.shape[0], block_embeds.shape
    dtype, device = block_embeds.dtype, block_embeds.device
    cos, sin = rope_tables(la.rope, d, n + b, dtype=dtype, device=device)
    ctx = rms_norm(F.linear(features, net.fc), net.hidden_norm, eps)  # [N, H]
    qpos = anchors[:, None] + torch.arange(b, device=device)[None, :]  # [A, B]
    # visibility: [A*B queries, N context keys + A*B block keys]
    see_ctx = torch.arange(n, device=device)[None, None, :] < anchors[:, None, None]
    see_ctx = see_ctx.expand(a, b, n).reshape(a * b, n)
    same = torch.arange(a, device=device).repeat_interleave(b)
    see_block = same[:, None] == same[None, :]
    visible = torch.cat([see_ctx, see_block], dim=1)
    key_pos = torch.cat([torch.arange(n, device=device), qpos.reshape(-1)])
    offset = qpos.reshape(-1)[:, None] - key_pos[None, :]  # query minus key position
    x = block_embeds.reshape(a * b, h)
    qcos, qsin = cos[qpos.reshape(-1)], sin[qpos.reshape(-1)]
    for i, layer in enumerate(net.layers):
        window = net.args.windows[i]  # sliding layers see keys with |q - k| < window
        mask = visible if window is None else visible & (offset.abs() < window)
        if net.args.causal[i]:  # and, causal ones, no later slot of their block
            mask = mask & (offset >= 0)
        wq, wk, wv = layer.wqkv.dense().split([nq * d, nkv * d, nkv * d])
        hn = rms_norm(x, layer.attn_norm, eps)
        q = rms_norm(F.linear(hn, wq).view(1, a * b, nq, d), layer.q_norm, eps)
        q = apply_rope(q, qcos, qsin)[0]  # [A*B, nq, d]
        keys_in = torch.cat([ctx, hn], dim=0)  # context, then every block's own inputs
        k = rms_norm(F.linear(keys_in, wk).view(1, -1, nkv, d), layer.k_norm, eps)
        kcos = torch.cat([cos[:n], qcos])
        ksin = torch.cat([sin[:n], qsin])
        k = apply_rope(k, kcos, ksin)[0]  # [N + A*B, nkv, d]
        v = F.linear(keys_in, wv).view(-1, nkv, d)
        k = k.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)  # [nq, keys, d]
        v = v.repeat_interleave(nq // nkv, dim=1).transpose(0, 1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask)
        x = x + F.linear(out.transpose(0, 1).reshape(a * b, nq * d), layer.wo.dense())
        normed = rms_norm(x, layer.ffn_norm, eps)
        gate, up = F.linear(normed, layer.w_gate_up.dense()).chunk(2, -1)
        x = x + F.linear(F.silu(gate) * up, layer.w_down.dense())
    return rms_norm(x, net.norm, eps).view(a, b, h)
