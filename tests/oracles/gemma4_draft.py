"""The slow oracle for DeepSpec's Gemma 4 drafters, written from DeepSpec's
`deepspec/modeling/dspark/gemma4/modeling.py` (`Gemma4DSparkModel._forward_backbone`,
`compute_logits`, the Markov and confidence heads) and transformers' Gemma 4 pieces it
uses (RMSNorm, proportional RoPE, GELU-tanh MLP).

It reads the checkpoint's tensors by their DeepSpec names and the config.json as given
(nothing of specgen's loader, fused weights or kernels), recomputes the context
projections of every context token, and works in float64. The drafter's cached fast
path (`DFlashNet.extend` + `block_hidden`, the head transform, `markov_draw`) must agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class ReferenceDraft:
    hidden: torch.Tensor  # [B, H] the block's backbone outputs, after the final norm
    base: torch.Tensor  # [B, V] compute_logits: lm_head, then the final soft-cap
    logits: torch.Tensor  # [B, V] base + the Markov bias of the previous token
    confidence: torch.Tensor | None  # [B] confidence-head logits


def _norm(x: torch.Tensor, w: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Gemma4RMSNorm: x * (mean(x^2) + eps)^-1/2, times the weight (none: the v norm)."""
    out = x * torch.pow(x.pow(2).mean(-1, keepdim=True) + eps, -0.5)
    return out if w is None else out * w


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def _rope(cfg: dict[str, Any], d: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [n, d] of transformers' proportional RoPE for full-attention layers."""
    full = (cfg.get("rope_parameters") or {}).get("full_attention", {})
    theta = float(full.get("rope_theta", 1e6))
    angles = int(float(full.get("partial_rotary_factor", 1.0)) * d // 2)
    inv = 1.0 / theta ** (torch.arange(0, 2 * angles, 2).double() / d)
    inv = torch.cat([inv, torch.zeros(d // 2 - angles, dtype=torch.float64)])
    freqs = torch.arange(n).double()[:, None] * inv[None, :]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


@torch.no_grad()
def reference_gemma_draft(
    tensors: dict[str, torch.Tensor],  # the drafter checkpoint, DeepSpec's names
    cfg: dict[str, Any],  # its config.json
    embed: torch.Tensor,  # [V, H] the target's embedding table (DeepSpec's copy of it)
    lm_head: torch.Tensor,  # [V, H] the target's LM head
    features: torch.Tensor,  # [L, K*H] target features of the context, positions 0..L-1
    anchor: int,
    tokens: list[int],  # the block's draft tokens (b), teacher-forced into the heads
) -> ReferenceDraft:
    t = {k: v.double() for k, v in tensors.items()}
    eps, b = float(cfg["rms_norm_eps"]), int(cfg["block_size"])
    nq, k_eq_v = int(cfg["num_attention_heads"]), bool(cfg["attention_k_eq_v"])
    nkv = int(cfg["num_global_key_value_heads" if k_eq_v else "num_key_value_heads"])
    d, hidden_size = int(cfg["global_head_dim"]), int(cfg["hidden_size"])
    length = features.shape[0]
    act = "tanh" if cfg.get("hidden_activation") == "gelu_pytorch_tanh" else "none"
    # the noise block: [anchor, mask x (b-1)] through Gemma4TextScaledWordEmbedding
    ids = torch.tensor([anchor] + [int(cfg["mask_token_id"])] * (b - 1))
    scale = torch.tensor(math.sqrt(hidden_size), dtype=embed.dtype)
    x = (embed[ids] * scale).double()
    ctx = _norm(features.double() @ t["fc.weight"].T, t["hidden_norm.weight"], eps)
    cos, sin = _rope(cfg, d, length + b)
    for i in range(int(cfg["num_hidden_layers"])):

        def w(name: str, i: int = i) -> torch.Tensor:  # layer i's tensor `name`
            return t[f"layers.{i}.{name}"]

        residual, h = x, _norm(x, w("input_layernorm.weight"), eps)
        q = (h @ w("self_attn.q_proj.weight").T).view(b, nq, d)
        q = _norm(q, w("self_attn.q_norm.weight"), eps)
        both = torch.cat([ctx, h])  # context keys, then the block's own
        k = both @ w("self_attn.k_proj.weight").T
        v = k if k_eq_v else both @ w("self_attn.v_proj.weight").T
        k = _norm(k.view(-1, nkv, d), w("self_attn.k_norm.weight"), eps)
        v = _norm(v.view(-1, nkv, d), None, eps)
        q = _rotate(q, cos[length:, None], sin[length:, None])
        k = _rotate(k, cos[:, None], sin[:, None])
        k, v = (z.repeat_interleave(nq // nkv, dim=1).transpose(0, 1) for z in (k, v))
        scores = q.transpose(0, 1) @ k.transpose(-1, -2)  # scaling 1.0, nothing masked
        out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(b, nq * d)
        out = out @ w("self_attn.o_proj.weight").T
        x = residual + _norm(out, w("post_attention_layernorm.weight"), eps)
        h = _norm(x, w("pre_feedforward_layernorm.weight"), eps)
        gate, up = h @ w("mlp.gate_proj.weight").T, h @ w("mlp.up_proj.weight").T
        mlp = (F.gelu(gate, approximate=act) * up) @ w("mlp.down_proj.weight").T
        x = x + _norm(mlp, w("post_feedforward_layernorm.weight"), eps)
        x = x * t.get(f"layers.{i}.layer_scalar", torch.ones(1, dtype=torch.float64))
    hidden = _norm(x, t["norm.weight"], eps)
    base = hidden @ lm_head.double().T
    cap = cfg.get("final_logit_softcapping")
    if cap is not None:
        base = torch.tanh(base / float(cap)) * float(cap)
    prev = torch.tensor([anchor, *tokens[: b - 1]])  # slot j's previous token
    logits, conf = base.clone(), None
    if int(cfg.get("markov_rank") or 0):  # the vanilla head: W2 W1[prev]
        logits += t["markov_head.markov_w1.weight"][prev] @ t["markov_head.markov_w2.weight"].T
    if cfg.get("enable_confidence_head"):
        feats = hidden
        if cfg.get("confidence_head_with_markov"):
            feats = torch.cat([hidden, t["markov_head.markov_w1.weight"][prev]], -1)
        bias = t.get("confidence_head.proj.bias", torch.zeros(1, dtype=torch.float64))
        conf = feats @ t["confidence_head.proj.weight"][0] + bias[0]
    return ReferenceDraft(hidden, base, logits, conf)
