"""The Llama-shaped decoder layer: attention (grouped-query, optional q/k/v and o biases,
optional per-head q/k RMSNorm, optional sigmoid output gate and partial RoPE) and a SwiGLU
MLP. Llama, Qwen2 and Qwen3 targets are made of it, Qwen3.5's attention layers are, and so
are the layers of every Qwen-style drafter (z-lab's DFlash, DeepSpec's DSpark).

q/k/v and gate/up are stored fused, so a decode step issues two matmuls fewer per layer;
the layer's load plan stacks the checkpoint's tensors into them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.qk_rope import apply_rope, qk_norm_rope
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.kv import StaticKVCache, widened
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.layers.blocks import add_mlp, mlp_plan, norm_weight, residual_mlp
from specgen.models.plans import Row


class DecoderLayer(nn.Module):
    def __init__(
        self,
        args: ModelArgs,
        dtype: torch.dtype,
        device: torch.device,
        in_features: int | None = None,  # q/k/v's input width (EAGLE-3's first layer: 2H)
    ) -> None:
        super().__init__()
        self.args = args
        h, d = args.hidden_size, args.head_dim
        self.in_features = in_features or h
        # Qwen3.5's gated attention: q_proj yields each head's query and its output gate
        self.q_rows = args.num_heads * d * (2 if args.attn_output_gate else 1)
        n_qkv = self.q_rows + 2 * args.num_kv_heads * d
        w, nw = dict(dtype=dtype, device=device), norm_weight(args, dtype, device)
        self.attn_norm = nw(h)
        self.wqkv = DenseWeight(n_qkv, self.in_features, **w)
        self.bqkv = new_weight(n_qkv, **w) if args.qkv_bias else None
        self.q_norm = nw(d) if args.qk_norm else None
        self.k_norm = nw(d) if args.qk_norm else None
        self.wo = DenseWeight(h, args.num_heads * d, **w)
        self.bo = new_weight(h, **w) if args.o_bias else None
        add_mlp(self, args, dtype, device)

    def plan(self, prefix: str) -> Iterator[Row]:
        """The HF tensors of this layer under `prefix` (targets and drafters alike); q/k/v
        and gate/up are stacked row-wise into the fused matrices."""
        a, p, h = self.args, prefix, self.args.hidden_size
        q_rows, kv_rows = self.q_rows, a.num_kv_heads * a.head_dim
        yield Row(p + "input_layernorm.weight", self.attn_norm, (h,))
        yield Row(p + "post_attention_layernorm.weight", self.ffn_norm, (h,))
        for kind in ("weight", "bias") if a.qkv_bias else ("weight",):
            dest, cols = (self.wqkv, (self.in_features,)) if kind == "weight" else (self.bqkv, ())
            yield Row(p + f"self_attn.q_proj.{kind}", dest, (q_rows, *cols))
            yield Row(p + f"self_attn.k_proj.{kind}", dest, (kv_rows, *cols), q_rows)
            yield Row(p + f"self_attn.v_proj.{kind}", dest, (kv_rows, *cols), q_rows + kv_rows)
        yield Row(p + "self_attn.o_proj.weight", self.wo, (h, a.num_heads * a.head_dim))
        if a.o_bias:
            yield Row(p + "self_attn.o_proj.bias", self.bo, (h,))
        if a.qk_norm:
            yield Row(p + "self_attn.q_norm.weight", self.q_norm, (a.head_dim,))
            yield Row(p + "self_attn.k_norm.weight", self.k_norm, (a.head_dim,))
        yield from mlp_plan(self, p, a.mlp_bias)

    def project_kv(
        self,
        h: torch.Tensor,  # [B, T, H], used as-is (no input norm): e.g. DFlash context features
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # k, v: [B, n_kv, T, d]
        """Keys and values of inputs that serve only as keys (no query, no residual)."""
        a = self.args
        bsz, t, _ = h.shape
        q_rows, kv = self.q_rows, a.num_kv_heads * a.head_dim
        bias = None if self.bqkv is None else self.bqkv[q_rows:]
        k, v = self.wqkv(h, bias, rows=slice(q_rows, None)).split([kv, kv], dim=-1)
        k = k.view(bsz, t, a.num_kv_heads, a.head_dim)
        if self.k_norm is not None:
            k = rms_norm(k, self.k_norm, a.rms_norm_eps)
        k = apply_rope(k, cos, sin).transpose(1, 2)
        return k, v.view(bsz, t, a.num_kv_heads, a.head_dim).transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
        cache: StaticKVCache,
        layer_id: int,
        mask: torch.Tensor | None,  # [T, L+T] bool, None when every key is visible
        causal: bool,
    ) -> torch.Tensor:  # [B, T, H]
        q, k, v, gate = self._qkv(x, cos, sin)
        keys, values = cache.write(layer_id, k, v)
        return self._output(x, attention(q, keys, values, mask, causal), gate)

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
        window: int | None = None,  # a sliding-window layer's reach (drafters)
    ) -> torch.Tensor:  # [B, T, H]
        """`forward` with the positions in device memory: no host value, no shape that
        depends on the cache length, so a CUDA graph of it replays at any length."""
        q, k, v, gate = self._qkv(x, cos, sin)
        cache.write_at(layer_id, positions, k, v)
        slot = cache.slot(layer_id)
        keys, values = widened(cache.k[slot], cache.v[slot], q.dtype)
        out = block_attention(q, keys, values, length, causal, window)
        return self._output(x, out, gate)

    def _qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """q, k (roped) and v, [B, n, T, d] each, and the output gate [B, T, nq*d] if any."""
        return self.qkv_of(rms_norm(x, self.attn_norm, self.args.rms_norm_eps), cos, sin)

    def qkv_of(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """`_qkv` of an input already normed ([B, T, in_features]): a DFlash 2 layer
        convolves it first; EAGLE-3's is two normed halves."""
        a = self.args
        bsz, t, _ = h.shape
        qkv = self.wqkv(h, self.bqkv)
        nq, nkv, d, rows = a.num_heads, a.num_kv_heads, a.head_dim, self.q_rows
        v = qkv[..., rows + nkv * d :].view(bsz, t, nkv, d).transpose(1, 2)
        gate = None
        if a.attn_output_gate:  # per head: d query channels, then d gate channels
            q_gate = qkv[..., :rows].view(bsz, t, nq, 2 * d)
            gate = q_gate[..., d:].reshape(bsz, t, nq * d)
            k = qkv[..., rows : rows + nkv * d].view(bsz, t, nkv, d)
            qk = torch.cat((q_gate[..., :d], k), dim=2)
        else:
            qk = qkv[..., : (nq + nkv) * d].view(bsz, t, nq + nkv, d)
        if a.rope_dim < d:  # partial rotary (Qwen3.5): norms, then RoPE on the first channels
            q = rms_norm(qk[:, :, :nq], self.q_norm, a.rms_norm_eps)
            k = rms_norm(qk[:, :, nq:], self.k_norm, a.rms_norm_eps)
            qk = apply_partial_rope(torch.cat((q, k), dim=2), cos, sin)
        elif self.q_norm is not None:  # q and k heads together: one set of ops (or one kernel)
            qk = qk_norm_rope(qk, nq, self.q_norm, self.k_norm, cos, sin, a.rms_norm_eps)
        else:
            qk = apply_rope(qk, cos, sin)
        return qk[:, :, :nq].transpose(1, 2), qk[:, :, nq:].transpose(1, 2), v, gate

    def _output(
        self, x: torch.Tensor, out: torch.Tensor, gate: torch.Tensor | None = None
    ) -> torch.Tensor:  # [B, T, H]
        """Output gate, projection, residual, MLP: what follows attention (`out`:
        [B, nq, T, d])."""
        bsz, t, _ = x.shape
        out = out.transpose(1, 2).reshape(bsz, t, -1)
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return residual_mlp(self, x, self.wo(out, self.bo))


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE on the first cos.shape[-1] channels of each head; the rest pass through."""
    r = cos.shape[-1]
    return torch.cat((apply_rope(x[..., :r], cos, sin), x[..., r:]), dim=-1)
