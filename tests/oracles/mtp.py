"""A slow float64 reference of a Qwen3.5 MTP head, written from the description (vLLM's
`Qwen3_5MultiTokenPredictor`, DeepSeek-V3's MTP): no cache, every entry recomputed.

Entry i pairs the target's last hidden state at position i (after its final norm) with the
token at i + 1, at RoPE position i:
    x = fc(cat(norm_e(embed(token)), norm_h(hidden)))
    x = full-attention decoder layer(x)   (causal over entries 0..i)
    out = norm(x)   -> the target's lm_head gives the logits of the token after `token`
A chain feeds `out` back as the next entry's hidden with the token it drafted. All norms are
zero-centred RMSNorms (x / rms(x) * (1 + w)); the layer is Qwen3.5's gated attention: q_proj
gives each head's query and an output gate (sigmoid), q/k RMSNorms per head, RoPE on the
first `partial_rotary_factor` of each head's channels (halves rotated), then a SwiGLU MLP.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


class Reference:
    def __init__(self, checkpoint: Path, config_dir: Path) -> None:
        """`checkpoint`: a directory or file holding `mtp.*`; `config_dir`: the target's."""
        files = [checkpoint] if checkpoint.is_file() else sorted(checkpoint.glob("*.safetensors"))
        self.w = {}
        for f in files:
            self.w |= {k: v.double() for k, v in load_file(str(f)).items() if k.startswith("mtp.")}
        cfg = json.loads((config_dir / "config.json").read_text())
        text = cfg.get("text_config", cfg)
        self.eps = text["rms_norm_eps"]
        self.heads, self.kv_heads = text["num_attention_heads"], text["num_key_value_heads"]
        self.d = text["head_dim"]
        rope = text.get("rope_parameters") or {}
        self.rot = int(self.d * rope.get("partial_rotary_factor", 0.25))
        self.theta = rope.get("rope_theta", 10000.0)

    def _norm(self, x, name):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.w[name])

    def _rope(self, x, positions):  # x [T, n, d]
        r = self.rot
        inv = 1.0 / self.theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
        freqs = positions.double()[:, None] * inv[None]
        cos, sin = torch.cat([freqs, freqs], -1).cos(), torch.cat([freqs, freqs], -1).sin()
        rot, rest = x[..., :r], x[..., r:]
        half = torch.cat([-rot[..., r // 2 :], rot[..., : r // 2]], -1)
        return torch.cat([rot * cos[:, None] + half * sin[:, None], rest], -1)

    def entries(self, tokens: list[int], hidden: torch.Tensor, embed: torch.Tensor):
        """Outputs [T, H] of entries 0..T-1 (token i with hidden row i), all at once."""
        w, p, d = self.w, "mtp.layers.0.", self.d
        t = len(tokens)
        e = self._norm(embed[tokens].double(), "mtp.pre_fc_norm_embedding.weight")
        h = self._norm(hidden.double(), "mtp.pre_fc_norm_hidden.weight")
        x = torch.cat([e, h], -1) @ w["mtp.fc.weight"].T
        a = self._norm(x, p + "input_layernorm.weight")
        qg = (a @ w[p + "self_attn.q_proj.weight"].T).view(t, self.heads, 2 * d)
        q, gate = qg[..., :d], qg[..., d:].reshape(t, -1)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(t, self.kv_heads, d)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(t, self.kv_heads, d)
        q = self._norm(q, p + "self_attn.q_norm.weight")
        k = self._norm(k, p + "self_attn.k_norm.weight")
        positions = torch.arange(t)
        q, k = self._rope(q, positions), self._rope(k, positions)
        group = self.heads // self.kv_heads
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
        scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        scores = scores.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), -math.inf)
        out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(t, -1)
        x = x + (out * torch.sigmoid(gate)) @ w[p + "self_attn.o_proj.weight"].T
        m = self._norm(x, p + "post_attention_layernorm.weight")
        mlp = F.silu(m @ w[p + "mlp.gate_proj.weight"].T) * (m @ w[p + "mlp.up_proj.weight"].T)
        x = x + mlp @ w[p + "mlp.down_proj.weight"].T
        return self._norm(x, "mtp.norm.weight")

    def draft(
        self,
        hidden: torch.Tensor,  # [n, H] the target's final (normed) hidden states of ids
        ids: list[int],  # the n committed tokens (in the target cache)
        anchor: int,
        k: int,
        embed: torch.Tensor,  # [V, H]
        head: torch.Tensor,  # [V, H]
    ) -> list[int]:
        """k greedy drafts after `anchor`, every entry recomputed at every chain step."""
        tokens = [*ids[1:], anchor]
        rows = hidden.double()
        drafts: list[int] = []
        for _ in range(k):
            out = self.entries(tokens, rows, embed)
            token = int((out[-1] @ head.double().T).argmax())
            drafts.append(token)
            tokens.append(token)
            rows = torch.cat([rows, out[-1:]], 0)
        return drafts
