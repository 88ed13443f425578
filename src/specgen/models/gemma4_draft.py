"""Gemma-4-style draft layers: DeepSpec's `Gemma4DSparkModel` backbone (DSpark and its plain
block-7 DFlash checkpoints for `google/gemma-4-12B-it`).

A drafter layer here differs from the Qwen3 layer of z-lab's DFlash (models/dflash.py):
- attention uses Gemma 4's global-layer shape: `global_head_dim`-wide heads, and with
  `attention_k_eq_v` no `v_proj` at all (values are the key projection, before k_norm);
  q_norm and k_norm scale, values get an RMSNorm without weight; scores are not scaled
  (scaling 1.0);
- RoPE is Gemma's "proportional" form for full-attention layers: the first
  partial_rotary_factor of each head's frequency pairs rotate with exponents over the
  whole head, the rest (zero frequency) pass through (models/rope.py);
- sandwich norms (post-attention, pre- and post-feed-forward) around a GELU-tanh MLP, and
  the layer output scaled by `layer_scalar` (a buffer DeepSpec saves, ones);
- every RMSNorm is Gemma's: x / rms(x) * w in fp32, rounded once (weights kept in fp32).
Keys and values of the context and of the block come from the same projections, as in
every DFlash-family drafter: `project_kv` for context features, `forward` for a block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from specgen.config import ModelArgs, RopeArgs
from specgen.errors import CheckpointError
from specgen.hf_configs import GELU, gemma4_mlp_widths
from specgen.kernels.attention import attention
from specgen.kernels.block_attention import block_attention
from specgen.kernels.linear import linear
from specgen.kernels.qk_rope import apply_rope
from specgen.kernels.rmsnorm import rms_norm
from specgen.models.blocks import new_weight
from specgen.models.kv_cache import StaticKVCache

ARCHITECTURES = ("Gemma4DSparkModel",)
TEXT_TYPES = ("gemma4_text", "gemma4_unified_text")


@dataclass(frozen=True)
class GemmaDraftArgs:
    """What Gemma draft layers have beyond the shapes in `DFlashArgs.layers` (whose
    num_kv_heads / head_dim are the attention's: global kv heads, global_head_dim)."""

    k_eq_v: bool  # values are the key projection (no v_proj)
    intermediate: tuple[int, ...]  # per layer (Gemma's double-wide MLP doubles some)
    approximate: str = "tanh"  # the MLP's GELU, F.gelu's form (gelu_pytorch_tanh: "tanh")


def is_gemma_draft(cfg: dict[str, Any]) -> bool:
    """DeepSpec's Gemma draft layout: its architecture, or a Gemma 4 text config."""
    archs = set(cfg.get("architectures") or [])
    return bool(archs & set(ARCHITECTURES)) or cfg.get("model_type") in TEXT_TYPES


def gemma_layers_from_hf(cfg: dict[str, Any], name: str) -> tuple[ModelArgs, GemmaDraftArgs]:
    """The draft layers' shapes from a DeepSpec Gemma draft config (a copy of the target's
    Gemma 4 text config with the drafter's fields written over it, `build_draft_config`)."""
    if cfg.get("enable_moe_block") or cfg.get("num_experts"):
        raise CheckpointError(f"{name}: Gemma 4 draft layers with MoE blocks are not supported")
    if int(cfg.get("hidden_size_per_layer_input") or 0):
        raise CheckpointError(f"{name}: per-layer input embeddings in a drafter are not supported")
    if cfg.get("attention_bias"):
        raise CheckpointError(f"{name}: attention biases in Gemma draft layers are not supported")
    act = cfg.get("hidden_activation", "gelu_pytorch_tanh")
    if act not in GELU:
        raise CheckpointError(f"{name}: unsupported activation {act!r}")
    try:
        k_eq_v = bool(cfg.get("attention_k_eq_v", False))
        heads = int(cfg["num_attention_heads"])
        kv, d = _attention_shape(cfg, k_eq_v)
        layers = int(cfg["num_hidden_layers"])
        inter = int(cfg["intermediate_size"])
        hidden = int(cfg["hidden_size"])
        rope = _rope(cfg, d, name)
        shared = int(cfg.get("num_kv_shared_layers") or 0)
        wide = bool(cfg.get("use_double_wide_mlp", False))
        args = ModelArgs(
            family="gemma4",
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=inter,
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=d,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_positions=int(cfg.get("max_position_embeddings", 131072)),
            rope=rope,
        )
    except KeyError as e:
        raise CheckpointError(f"{name}: config.json lacks the field {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{name}: config.json has a malformed field ({e})") from None
    if heads % kv:
        raise CheckpointError(f"{name}: {heads} attention heads for {kv} key/value heads")
    widths = gemma4_mlp_widths(inter, layers, shared, wide)
    return args, GemmaDraftArgs(k_eq_v=k_eq_v, intermediate=widths, approximate=GELU[act])


def _attention_shape(cfg: dict[str, Any], k_eq_v: bool) -> tuple[int, int]:
    """(kv heads, head dim) of the draft attention, DeepSpec's rule: `global_head_dim`, and
    `num_global_key_value_heads` under `attention_k_eq_v`. A config saved by a newer
    transformers gives them per full-attention layer (`per_layer_config`) instead."""
    per_layer = next(iter((cfg.get("per_layer_config") or {}).values()), {})
    d = int(cfg.get("global_head_dim") or per_layer.get("head_dim") or 512)
    if not k_eq_v:
        return int(cfg["num_key_value_heads"]), d
    kv = cfg.get("num_global_key_value_heads") or per_layer.get("num_key_value_heads")
    return int(kv if kv is not None else cfg["num_global_key_value_heads"]), d


def _rope(cfg: dict[str, Any], head_dim: int, name: str) -> RopeArgs:
    """The full-attention RoPE: `rope_parameters["full_attention"]` (Gemma 4 nests one set
    per layer type; DeepSpec's draft layers are all full attention)."""
    params = cfg.get("rope_parameters") or {}
    full = params.get("full_attention", params)
    kind = full.get("rope_type") or "default"
    theta = float(full.get("rope_theta") or 1_000_000.0)
    if kind == "proportional":
        partial, factor = float(full.get("partial_rotary_factor", 1.0)), full.get("factor", 1)
        return RopeArgs(theta=theta, kind=kind, factor=float(factor), partial=partial)
    if kind == "default" and int(cfg.get("head_dim") or head_dim) == head_dim:
        return RopeArgs(theta=theta)  # transformers' default rope over head_dim
    raise CheckpointError(f"{name}: unsupported RoPE {kind!r} for the draft layers")


def unit_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm without a weight (the value norm), in fp32, rounded once."""
    xf = x.float()
    return (xf * torch.pow(xf.pow(2).mean(-1, keepdim=True) + eps, -0.5)).to(x.dtype)


class GemmaDraftLayer(nn.Module):
    """One DeepSpec Gemma draft layer (non-causal over its block, context K/V injected)."""

    def __init__(
        self, args: ModelArgs, gemma: GemmaDraftArgs, index: int, dtype: torch.dtype,
        device: torch.device,
    ) -> None:  # fmt: skip
        super().__init__()
        self.args, self.gemma = args, gemma
        h, d, nq, nkv = args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads
        inter = gemma.intermediate[index]
        w = dict(dtype=dtype, device=device)
        norm = dict(dtype=torch.float32, device=device)  # Gemma scales in fp32, rounds once
        self.kv_rows = nkv * d * (1 if gemma.k_eq_v else 2)
        self.attn_norm = new_weight(h, **norm)
        self.wqkv = new_weight(nq * d + self.kv_rows, h, **w)
        self.q_norm = new_weight(d, **norm)
        self.k_norm = new_weight(d, **norm)
        self.wo = new_weight(h, nq * d, **w)
        self.post_attn_norm = new_weight(h, **norm)
        self.ffn_norm = new_weight(h, **norm)
        self.w_gate_up = new_weight(2 * inter, h, **w)
        self.w_down = new_weight(h, inter, **w)
        self.post_ffn_norm = new_weight(h, **norm)
        self.scalar = new_weight(1, **w)
        self.scalar.data.fill_(1.0)  # a checkpoint without `layer_scalar` keeps it at 1

    def project_kv(
        self,
        h: torch.Tensor,  # [B, T, H]: inputs that serve only as keys (context features)
        cos: torch.Tensor,  # [T, d]
        sin: torch.Tensor,  # [T, d]
    ) -> tuple[torch.Tensor, torch.Tensor]:  # k, v: [B, n_kv, T, d]
        a = self.args
        return self._kv(linear(h, self.wqkv[a.num_heads * a.head_dim :], None), cos, sin)

    def _kv(self, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """k (normed, roped) and v (unit-normed) from their projection rows [B, T, rows]."""
        a = self.args
        bsz, t, _ = kv.shape
        k = kv[..., : a.num_kv_heads * a.head_dim].view(bsz, t, a.num_kv_heads, a.head_dim)
        v = k if self.gemma.k_eq_v else kv[..., k.shape[2] * a.head_dim :].view_as(k)
        k = apply_rope(rms_norm(k, self.k_norm, a.rms_norm_eps), cos, sin)
        return k.transpose(1, 2), unit_norm(v, a.rms_norm_eps).transpose(1, 2)

    def _qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q, k (normed, roped), v (unit-normed): [B, n, T, d] each."""
        a = self.args
        bsz, t, _ = x.shape
        h = rms_norm(x, self.attn_norm, a.rms_norm_eps)
        qkv = linear(h, self.wqkv, None)
        rows = a.num_heads * a.head_dim
        q = qkv[..., :rows].view(bsz, t, a.num_heads, a.head_dim)
        q = apply_rope(rms_norm(q, self.q_norm, a.rms_norm_eps), cos, sin).transpose(1, 2)
        k, v = self._kv(qkv[..., rows:], cos, sin)
        return q, k, v

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
        q, k, v = self._qkv(x, cos, sin)
        keys, values = cache.write(layer_id, k, v)
        return self._output(x, attention(q, keys, values, mask, causal, scale=1.0))

    def forward_static(
        self,
        x: torch.Tensor,  # [B, T, H]
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache,
        layer_id: int,
        positions: torch.Tensor,  # [T] int64 on the device
        length: torch.Tensor,  # [1] int32
        causal: bool = False,
        window: int | None = None,
    ) -> torch.Tensor:  # [B, T, H]
        """`forward` with positions in device memory (a CUDA graph of the draft step)."""
        q, k, v = self._qkv(x, cos, sin)
        cache.write_at(layer_id, positions, k, v)
        slot = cache.slot(layer_id)
        out = block_attention(q, cache.k[slot], cache.v[slot], length, causal, window, 1.0)
        return self._output(x, out)

    def _output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Sandwich-normed attention output and MLP, each with its residual; then the
        layer scalar (`out`: [B, nq, T, d])."""
        a = self.args
        bsz, t, _ = x.shape
        mixed = linear(out.transpose(1, 2).reshape(bsz, t, -1), self.wo, None)
        x = x + rms_norm(mixed, self.post_attn_norm, a.rms_norm_eps)
        gate, up = linear(rms_norm(x, self.ffn_norm, a.rms_norm_eps), self.w_gate_up, None).chunk(
            2, dim=-1
        )
        mlp = linear(F.gelu(gate, approximate=self.gemma.approximate) * up, self.w_down, None)
        return (x + rms_norm(mlp, self.post_ffn_norm, a.rms_norm_eps)) * self.scalar


def gemma_layer_plan(layer: GemmaDraftLayer, prefix: str):
    """DeepSpec's tensor names of one Gemma draft layer (q/k/v and gate/up stacked)."""
    a, p = layer.args, prefix
    inter = layer.w_down.shape[1]
    yield p + "input_layernorm.weight", layer.attn_norm, 0
    yield p + "self_attn.q_proj.weight", layer.wqkv, 0
    yield p + "self_attn.k_proj.weight", layer.wqkv, a.num_heads * a.head_dim
    if not layer.gemma.k_eq_v:
        yield p + "self_attn.v_proj.weight", layer.wqkv, (a.num_heads + a.num_kv_heads) * a.head_dim
    yield p + "self_attn.o_proj.weight", layer.wo, 0
    yield p + "self_attn.q_norm.weight", layer.q_norm, 0
    yield p + "self_attn.k_norm.weight", layer.k_norm, 0
    yield p + "post_attention_layernorm.weight", layer.post_attn_norm, 0
    yield p + "pre_feedforward_layernorm.weight", layer.ffn_norm, 0
    yield p + "mlp.gate_proj.weight", layer.w_gate_up, 0
    yield p + "mlp.up_proj.weight", layer.w_gate_up, inter
    yield p + "mlp.down_proj.weight", layer.w_down, 0
    yield p + "post_feedforward_layernorm.weight", layer.post_ffn_norm, 0


def gemma_shape(args: ModelArgs, gemma: GemmaDraftArgs, key: str) -> tuple[int, ...]:
    """The shape DeepSpec's tensor `key` of a draft layer must have."""
    h, d = args.hidden_size, args.head_dim
    index, leaf = int(key.split(".")[1]), ".".join(key.split(".")[2:])
    inter = gemma.intermediate[index]
    shapes = {
        "self_attn.q_proj.weight": (args.num_heads * d, h),
        "self_attn.k_proj.weight": (args.num_kv_heads * d, h),
        "self_attn.v_proj.weight": (args.num_kv_heads * d, h),
        "self_attn.o_proj.weight": (h, args.num_heads * d),
        "self_attn.q_norm.weight": (d,),
        "self_attn.k_norm.weight": (d,),
        "mlp.gate_proj.weight": (inter, h),
        "mlp.up_proj.weight": (inter, h),
        "mlp.down_proj.weight": (h, inter),
        "layer_scalar": (1,),
    }
    return shapes.get(leaf, (h,))  # the four layer norms
