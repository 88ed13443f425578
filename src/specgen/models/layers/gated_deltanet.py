"""Qwen3.5's Gated DeltaNet layer ("linear_attention"), as transformers defines it.

    h          = RMSNorm(x)                               (zero-centred weight)
    qkv, z, b, a = projections of h                       (one fused matmul here)
    qkv        = silu(depthwise causal conv(qkv))         (kernel K over the last K tokens)
    q, k       = L2-normalised per head (q also scaled by 1/sqrt(dk)); v
    g          = -exp(A_log) * softplus(a + dt_bias)      (log decay per value head;
                                                           -exp(A_log) computed at load)
    beta       = sigmoid(b)
    o          = gated delta rule(q, k, v, g, beta)       (kernels/gated_delta.py)
    x          = x + out_proj(RMSNorm(o) * silu(z)),  then the MLP block

The conv and the recurrent state of each sequence live in the hybrid cache
(models/cache/hybrid.py), which says per forward where to read and write them: a decode or
verify step replays the committed part of the step before from its saved inputs, then runs
its own tokens and saves theirs (so it can be rolled back); a prefill runs the chunked
form and hands the cache the states it asks for.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specgen.core.config import ModelArgs
from specgen.kernels.gated_delta import gated_delta_chunked, gated_delta_replay, replay_tape
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.cache.hybrid import HybridCache, LinearStep
from specgen.models.formats.weights import DenseWeight, new_weight
from specgen.models.layers.blocks import add_mlp, mlp_plan, norm_weight, residual_mlp
from specgen.models.plans import Row

L2_EPS = 1e-6  # transformers' (and fla's) l2norm epsilon


class GatedDeltaNetLayer(nn.Module):
    def __init__(self, args: ModelArgs, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        hy = args.layout
        assert hy is not None
        self.args, self.hy = args, hy
        h, value_width = args.hidden_size, hy.value_heads * hy.value_dim
        w = dict(dtype=dtype, device=device)
        self.attn_norm = norm_weight(args, dtype, device)(h)
        # [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a] stacked: one matmul per step
        self.splits = (hy.conv_dim, value_width, hy.value_heads, hy.value_heads)
        self.w_in = DenseWeight(sum(self.splits), h, **w)
        self.conv_w = new_weight(hy.conv_dim, 1, hy.conv_kernel, **w)  # depthwise taps
        # kept in fp32: transformers computes the decay in fp32 from them. `decay` is loaded
        # from A_log and holds -exp(A_log) once the family's finish_load has run (what every
        # step computed before; llama.cpp's files store it so, models/formats/gguf/index.py)
        self.decay = new_weight(hy.value_heads, dtype=torch.float32, device=device)
        self.dt_bias = new_weight(hy.value_heads, dtype=torch.float32, device=device)
        self.out_norm = new_weight(hy.value_dim, **w)  # the gated RMSNorm (plain weight)
        self.w_out = DenseWeight(h, value_width, **w)
        add_mlp(self, args, dtype, device)

    def plan(self, prefix: str):
        """The HF tensors of this layer under `prefix` (the four input projections stacked)."""
        hy, p, h = self.hy, prefix + "linear_attn.", self.args.hidden_size
        yield Row(prefix + "input_layernorm.weight", self.attn_norm, (h,))
        yield Row(prefix + "post_attention_layernorm.weight", self.ffn_norm, (h,))
        rows = 0
        for name, width in zip(("qkv", "z", "b", "a"), self.splits, strict=True):
            yield Row(p + f"in_proj_{name}.weight", self.w_in, (width, h), rows)
            rows += width
        yield Row(p + "conv1d.weight", self.conv_w, (hy.conv_dim, 1, hy.conv_kernel))
        yield Row(p + "A_log", self.decay, (hy.value_heads,))
        yield Row(p + "dt_bias", self.dt_bias, (hy.value_heads,))
        yield Row(p + "norm.weight", self.out_norm, (hy.value_dim,))
        yield Row(p + "out_proj.weight", self.w_out, (h, hy.value_heads * hy.value_dim))
        yield from mlp_plan(self, prefix)

    def forward(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,  # unused: no positions in a recurrent layer
        sin: torch.Tensor,
        cache: HybridCache,
        layer_id: int,
        mask: torch.Tensor | None,  # unused (padding comes with the cache's step)
        causal: bool,
    ) -> torch.Tensor:  # [B, T, H]
        assert cache.step is not None, "the hybrid forward begins a step first"
        return self._mix(x, cache, layer_id, cache.step)

    def forward_static(
        self, x, cos, sin, cache: HybridCache, layer_id, positions, length, **_
    ) -> torch.Tensor:  # the same step, its slots computed on the device (begin_static)
        assert cache.step is not None
        return self._mix(x, cache, layer_id, cache.step)

    def _mix(
        self, x: torch.Tensor, cache: HybridCache, layer_id: int, step: LinearStep
    ) -> torch.Tensor:
        a, hy = self.args, self.hy
        bsz, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, a.rms_norm_eps)
        if step.real is not None:  # left padding contributes nothing to the state
            h = h * step.real[..., None].to(h.dtype)
        mixed, z, b, dt = self.w_in(h).split(self.splits, dim=-1)
        j = cache.state_slot(layer_id)
        ring = cache.conv[j]  # [B, C, Rc]: conv inputs by position
        inputs = torch.cat((ring.index_select(2, step.conv_read), mixed.transpose(1, 2)), dim=2)
        if not step.prefill:  # a prefill's inputs enter the ring when it commits
            ring.index_copy_(2, step.conv_write, inputs[:, :, -t:])
        conv = F.conv1d(inputs, self.conv_w, groups=hy.conv_dim)  # [B, C, T]
        widths = (hy.key_heads * hy.key_dim,) * 2 + (hy.value_heads * hy.value_dim,)
        q, k, v = F.silu(conv).transpose(1, 2).split(widths, dim=-1)
        q = _l2norm(q.reshape(bsz, t, hy.key_heads, hy.key_dim).float()) * hy.key_dim**-0.5
        k = _l2norm(k.reshape(bsz, t, hy.key_heads, hy.key_dim).float())
        v = v.reshape(bsz, t, hy.value_heads, hy.value_dim).float()
        beta = torch.sigmoid(b).float()  # rounded as transformers does, then fp32
        g = self.decay * F.softplus(dt.float() + self.dt_bias)
        base, tape = cache.generation(layer_id, step.read)
        if step.prefill:
            start = replay_tape(base, tape, step.replay)  # the state the block starts from
            out = self._prefill(q, k, v, g, beta, start, inputs, cache, layer_id, step)
        else:  # replay what was committed of the last step, then this one; keep its inputs
            in_place = isinstance(step.write, int)  # else the generation is on the device
            start = cache.generation(layer_id, step.write)[0] if in_place else base.clone()
            out = gated_delta_replay(q, k, v, g, beta, base, tape, step.replay, start)
            cache.keep_step(layer_id, step.write, None if in_place else start, (q, k, v, g, beta))
        out = _gated_norm(out.to(x.dtype), z, self.out_norm, a.rms_norm_eps, hy.value_dim)
        return residual_mlp(self, x, self.w_out(out))

    def _prefill(self, q, k, v, g, beta, state, inputs, cache, layer_id, step) -> torch.Tensor:
        """The chunked form over the block, cut at the cache's snapshot points, each handed
        to the cache with the K-1 conv inputs before it (the last is the block's end)."""
        outs, done, width = [], 0, self.hy.conv_kernel - 1
        for end in step.snapshots:
            part = slice(done, end)
            out, state = gated_delta_chunked(q[:, part], k[:, part], v[:, part], g[:, part],
                                             beta[:, part], state)  # fmt: skip
            outs.append(out)
            cache.stage(layer_id, end, state, inputs[:, :, end : end + width])
            done = end
        return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


def _l2norm(x: torch.Tensor) -> torch.Tensor:  # [..., d] fp32
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + L2_EPS)


def _gated_norm(
    o: torch.Tensor,  # [B, T, Hv, dv] in the model dtype
    z: torch.Tensor,  # [B, T, Hv * dv] the gate
    weight: torch.Tensor,  # [dv]
    eps: float,
    dv: int,
) -> torch.Tensor:  # [B, T, Hv * dv]
    """RMSNorm of each value head, weighted, times silu(z), rounded as transformers does."""
    bsz, t = o.shape[:2]
    of = o.float()
    normed = (of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + eps)).to(o.dtype)
    gated = (weight * normed).float() * F.silu(z.view(bsz, t, -1, dv).float())
    return gated.to(o.dtype).reshape(bsz, t, -1)
