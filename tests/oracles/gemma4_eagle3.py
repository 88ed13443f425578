"""The slow oracle for DeepSpec's Gemma 4 EAGLE-3 drafter (`eagle3_gemma4_12b_ttt7`),
written from DeepSpec's `deepspec/modeling/eagle3/gemma4/modeling.py`
(`Gemma4Eagle3Model`, `Gemma4Eagle3DecoderLayer`, `Gemma4Eagle3Attention`) and
`deepspec/eval/eagle3/evaluator.py` (`_init_context`, `_propose`), with transformers'
Gemma 4 pieces they use (RMSNorm, proportional RoPE, the GELU-tanh MLP, the scaled
embedding) as in tests/oracles/gemma4_draft.py.

It reads the checkpoint by DeepSpec's tensor names and the config.json as given (nothing
of specgen's loader, fused weights or kernels), embeds and drafts through the
checkpoint's own copies of the target's embedding and head, keeps no cache (every chain
step runs the whole entry sequence again, causally) and works in float64. Entry i pairs
fc(the target's features at position i) with token i + 1 at RoPE position i; a chain
entry pairs the previous entry's output (before the final norm) with the token drafted.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from oracles.gemma4_draft import _norm, _rope, _rotate


def _layer(t: dict[str, torch.Tensor], cfg: dict[str, Any], i: int, emb, x, cos, sin):
    """`Gemma4Eagle3DecoderLayer` i over the entries (emb, x: [n, H]; cos/sin: [n, d])."""
    eps, n = float(cfg["rms_norm_eps"]), x.shape[0]
    nq, k_eq_v = int(cfg["num_attention_heads"]), bool(cfg["attention_k_eq_v"])
    nkv = int(cfg["num_global_key_value_heads" if k_eq_v else "num_key_value_heads"])
    d = int(cfg["global_head_dim"])
    act = "tanh" if cfg.get("hidden_activation") == "gelu_pytorch_tanh" else "none"

    def w(name: str) -> torch.Tensor:
        return t[f"layers.{i}.{name}"]

    residual = x
    both = torch.cat([_norm(emb, w("input_layernorm.weight"), eps),
                      _norm(x, w("hidden_norm.weight"), eps)], -1)  # fmt: skip
    q = _norm(
        (both @ w("self_attn.q_proj.weight").T).view(n, nq, d), w("self_attn.q_norm.weight"), eps
    )
    k = (both @ w("self_attn.k_proj.weight").T).view(n, nkv, d)
    v = k if k_eq_v else (both @ w("self_attn.v_proj.weight").T).view(n, nkv, d)
    k, v = _norm(k, w("self_attn.k_norm.weight"), eps), _norm(v, None, eps)
    q, k = _rotate(q, cos[:, None], sin[:, None]), _rotate(k, cos[:, None], sin[:, None])
    k, v = (z.repeat_interleave(nq // nkv, dim=1).transpose(0, 1) for z in (k, v))
    scores = q.transpose(0, 1) @ k.transpose(-1, -2)  # scaling 1.0
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(0, 1).reshape(n, nq * d)
    x = residual + _norm(
        out @ w("self_attn.o_proj.weight").T, w("post_attention_layernorm.weight"), eps
    )
    h = _norm(x, w("pre_feedforward_layernorm.weight"), eps)
    gate, up = h @ w("mlp.gate_proj.weight").T, h @ w("mlp.up_proj.weight").T
    mlp = (F.gelu(gate, approximate=act) * up) @ w("mlp.down_proj.weight").T
    x = x + _norm(mlp, w("post_feedforward_layernorm.weight"), eps)
    return x * t.get(f"layers.{i}.layer_scalar", torch.ones(1, dtype=torch.float64))


@torch.no_grad()
def reference_gemma_eagle3_chain(
    tensors: dict[str, torch.Tensor],  # the drafter checkpoint, DeepSpec's names
    cfg: dict[str, Any],  # its config.json
    features: torch.Tensor,  # [n, K*H] the target's taps at positions 0..n-1, concatenated
    tokens: list[int],  # x_0..x_{n-1}
    anchor: int,  # x_n
    k: int,
    forced: list[int] | None = None,  # a sampled chain's tokens, teacher-forced
) -> tuple[list[int], list[torch.Tensor]]:  # the drafts, each position's logits [V]
    t = {name: v.double() for name, v in tensors.items()}
    eps, hidden_size = float(cfg["rms_norm_eps"]), int(cfg["hidden_size"])
    embed = tensors["embed_tokens.weight"]  # Gemma4TextScaledWordEmbedding: rows * sqrt(H),
    scale = torch.tensor(math.sqrt(hidden_size), dtype=embed.dtype)  # the scale in its dtype
    hidden = list(features.double() @ t["fc.weight"].T)
    ids = [*tokens[1:], anchor]
    cap = cfg.get("final_logit_softcapping")
    drafts, all_logits = [], []
    for step in range(k):
        emb = (embed[torch.tensor(ids)] * scale).double()
        x = torch.stack(hidden)
        cos, sin = _rope(cfg, int(cfg["global_head_dim"]), len(ids))
        for i in range(int(cfg["num_hidden_layers"])):
            x = _layer(t, cfg, i, emb, x, cos, sin)
        out = x[-1]
        logits = _norm(out, t["norm.weight"], eps) @ t["lm_head.weight"].T
        if cap is not None:
            logits = torch.tanh(logits / float(cap)) * float(cap)
        all_logits.append(logits)
        token = int(logits.argmax()) if forced is None else forced[step]
        drafts.append(token)
        ids.append(token)
        hidden.append(out)
    return drafts, all_logits
