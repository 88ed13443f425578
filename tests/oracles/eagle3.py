"""A deliberately slow EAGLE-3 oracle, independent of methods/eagle3/network.py: its own reading of
the checkpoint (raw tensor names of each layout, config fields), no cache, float64.

Written from the reference code: SafeAILab EAGLE `cnets.py` (`LlamaDecoderLayeremb`,
`topK_genrate`), SpecForge `llama3_eagle.py` (`LlamaForCausalLMEagle3`), vLLM speculators
`eagle3/core.py` + `model_definitions.py` (`Eagle3FirstLayerMixin`) and DeepSpec
`modeling/eagle3/qwen3/modeling.py` + `eval/eagle3/evaluator.py`. For every chain step the
whole entry sequence is run again from scratch: entry i = (fc(features of position i),
token i + 1) at RoPE position i, each chain entry = (the previous entry's output, the token
it drafted). Taps index the HF `hidden_states` tuple (index j = the state entering layer j).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps))


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:  # [T, n, d], positions 0..T-1
    t, _, d = x.shape
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + half * sin


class Reference:
    def __init__(self, drafter: Path, num_target_layers: int) -> None:
        cfg = json.loads((drafter / "config.json").read_text())
        self.w = {k: v.double() for k, v in load_file(str(drafter / "model.safetensors")).items()}
        arch = cfg.get("architectures") or []
        if cfg.get("speculators_model_type") == "eagle3":
            self.layout, lc = "speculators", cfg["transformer_layer_config"]
            ids = cfg.get("eagle_aux_hidden_state_layer_ids")
            self.entering = ids or [2, num_target_layers // 2, num_target_layers - 3]
            self.norm_before_residual = cfg.get("norm_before_residual", False)
            self.feed_normed = cfg.get("norm_output", False)  # Eagle 3.1
            self.logits_normed = True
        elif "Qwen3Eagle3Model" in arch:
            self.layout, lc = "deepspec", cfg
            self.entering = [i + 1 for i in cfg["target_layer_ids"]]  # hidden_states[id + 1]
            self.norm_before_residual = self.feed_normed = False
            self.logits_normed = True
        else:
            self.layout, lc = "specforge", cfg
            explicit = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            explicit = explicit or cfg.get("eagle_aux_hidden_state_layer_ids")
            # SGLang: "for the ith layer, it takes the output of the (i-1)th layer" (+1)
            self.entering = (
                [i + 1 for i in explicit]
                if explicit
                else [2, num_target_layers // 2, num_target_layers - 3]
            )
            self.norm_before_residual = self.feed_normed = False
            self.logits_normed = cfg.get("norm_output", True)
        self.fc_norm = cfg.get("fc_norm", False)
        self.norm_before_fc = cfg.get("norm_before_fc", False)
        self.eps = lc["rms_norm_eps"]
        self.theta = lc.get("rope_theta", 10000.0)
        self.heads, self.kv_heads = lc["num_attention_heads"], lc["num_key_value_heads"]
        self.head_dim = lc.get("head_dim") or lc["hidden_size"] // self.heads
        self.n_layers = 1 if self.layout == "specforge" else lc["num_hidden_layers"]

    def _layer_keys(self, i: int) -> str:
        return "midlayer." if self.layout == "specforge" else f"layers.{i}."

    def _attention(self, p: str, x: torch.Tensor) -> torch.Tensor:  # [T, in] -> [T, H]
        w, t, d = self.w, x.shape[0], self.head_dim
        q = (x @ w[p + "self_attn.q_proj.weight"].T).view(t, self.heads, d)
        k = (x @ w[p + "self_attn.k_proj.weight"].T).view(t, self.kv_heads, d)
        v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, self.kv_heads, d)
        if p + "self_attn.q_norm.weight" in w:  # Qwen3 layers
            q = _rms(q, w[p + "self_attn.q_norm.weight"], self.eps)
            k = _rms(k, w[p + "self_attn.k_norm.weight"], self.eps)
        q, k = _rope(q, self.theta), _rope(k, self.theta)
        out = torch.zeros(t, self.heads, d, dtype=torch.float64)
        group = self.heads // self.kv_heads
        for h in range(self.heads):
            for i in range(t):  # query i sees keys 0..i
                scores = (k[: i + 1, h // group] @ q[i, h]) / math.sqrt(d)
                out[i, h] = torch.softmax(scores, 0) @ v[: i + 1, h // group]
        return out.reshape(t, -1) @ w[p + "self_attn.o_proj.weight"].T

    def _mlp(self, p: str, x: torch.Tensor) -> torch.Tensor:
        w = self.w
        gate = x @ w[p + "mlp.gate_proj.weight"].T
        up = x @ w[p + "mlp.up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T

    def _run(self, emb: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:  # [T, H] each
        w, x = self.w, hidden
        for i in range(self.n_layers):
            p = self._layer_keys(i)
            if i == 0 or self.layout == "deepspec":  # cat(norm(emb), norm(hidden)), 2H wide
                e = _rms(emb, w[p + "input_layernorm.weight"], self.eps)
                hn = _rms(x, w[p + "hidden_norm.weight"], self.eps)
                residual = hn if self.norm_before_residual else x
                x = residual + self._attention(p, torch.cat([e, hn], -1))
            else:  # speculators' later layers: a plain decoder layer
                x = x + self._attention(p, _rms(x, w[p + "input_layernorm.weight"], self.eps))
            x = x + self._mlp(p, _rms(x, w[p + "post_attention_layernorm.weight"], self.eps))
        return x

    def _project(self, features: torch.Tensor) -> torch.Tensor:  # [n, K*Ht] -> [n, H]
        w = self.w
        if self.norm_before_fc:
            features = _rms(features, w["input_norm.weight"], self.eps)
        if self.fc_norm:
            chunks = features.chunk(len(self.entering), -1)
            features = torch.cat(
                [_rms(c, w[f"fc_norm.{j}.weight"], self.eps) for j, c in enumerate(chunks)], -1
            )
        return features @ w["fc.weight"].T

    @torch.no_grad()
    def draft(
        self,
        hidden_states: tuple[torch.Tensor, ...],  # HF's, over tokens x_0..x_{n-1}: [1, n, H]
        tokens: list[int],  # x_0..x_{n-1}
        anchor: int,  # x_n
        k: int,
        embed: torch.Tensor,  # [V, H] the target's embedding
        head: torch.Tensor,  # [V, H] the target's LM head (for a full-vocabulary drafter)
    ) -> list[int]:
        """The greedy chain of k drafts."""
        return self.chain(hidden_states, tokens, anchor, k, embed, head)[0]

    @torch.no_grad()
    def chain(
        self,
        hidden_states: tuple[torch.Tensor, ...],
        tokens: list[int],
        anchor: int,
        k: int,
        embed: torch.Tensor,
        head: torch.Tensor,
        forced: list[int] | None = None,  # the chain's tokens (target ids), else greedy
    ) -> tuple[list[int], list[torch.Tensor]]:  # drafts, each position's draft-index logits
        """The chain of k drafts and the logits each was drawn from: greedy, or `forced`
        (a sampled chain's tokens, teacher-forced: the logits of what was drawn after)."""
        w = self.w
        features = torch.cat([hidden_states[j][0].double() for j in self.entering], -1)
        hidden = list(self._project(features))
        ids = [*tokens[1:], anchor]
        lm = w.get("lm_head.weight") if self.layout != "deepspec" else head.double()
        d2t = w.get("d2t")
        out, all_logits = [], []
        for step in range(k):
            x = self._run(embed.double()[ids], torch.stack(hidden))[-1]
            normed = _rms(x, w["norm.weight"], self.eps)
            logits = (normed if self.logits_normed or self.feed_normed else x) @ lm.T
            all_logits.append(logits)
            j = int(logits.argmax())
            token = j + (int(d2t[j]) if d2t is not None else 0)
            if forced is not None:
                token = forced[step]
            out.append(token)
            ids.append(token)
            hidden.append(normed if self.feed_normed else x)
        return out, all_logits
