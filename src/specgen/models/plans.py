"""Which checkpoint tensor fills which weight (a plan), and the shape each must have.

Llama, Qwen2 and Qwen3 checkpoints keep the decoder under `model.`. Published Qwen3.5
checkpoints are the multimodal `Qwen3_5ForConditionalGeneration`: the text backbone under
`model.language_model.`, the LM head at `lm_head.weight`, beside a vision tower
(`model.visual.*`) and a multi-token-prediction head (`mtp.*`) that text generation never
reads (only their names are seen, in the safetensors headers); a text-only save
(`Qwen3_5ForCausalLM`) has the backbone under `model.`. Zero-centred RMSNorm weights (the
scale is 1 + w) get their 1 added once after loading, in fp32 (models/blocks.norm_weight).
Gemma 4 is published the same way (`Gemma4ForConditionalGeneration`: text under
`model.language_model.`, beside vision and audio towers that are never read).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from specgen.config import ModelArgs
from specgen.models.gemma4 import Gemma4Layer
from specgen.models.transformer import DecoderLayer, Transformer

Plan = Iterator[tuple[str, torch.Tensor, int]]  # (tensor name, destination, row offset)


def layer_plan(args: ModelArgs, layer: DecoderLayer, prefix: str) -> Plan:
    """The HF tensors of one decoder layer under `prefix` (targets and drafters alike).

    q/k/v and gate/up are stacked row-wise into the fused matrices, hence the offset.
    """
    q_rows = layer.q_rows  # Qwen3.5's q_proj also yields the output gate
    kv_rows = args.num_kv_heads * args.head_dim
    p = prefix
    yield p + "input_layernorm.weight", layer.attn_norm, 0
    yield p + "post_attention_layernorm.weight", layer.ffn_norm, 0
    for kind in ("weight", "bias") if args.qkv_bias else ("weight",):
        dest = layer.wqkv if kind == "weight" else layer.bqkv
        yield p + f"self_attn.q_proj.{kind}", dest, 0
        yield p + f"self_attn.k_proj.{kind}", dest, q_rows
        yield p + f"self_attn.v_proj.{kind}", dest, q_rows + kv_rows
    yield p + "self_attn.o_proj.weight", layer.wo, 0
    if args.o_bias:
        yield p + "self_attn.o_proj.bias", layer.bo, 0
    if args.qk_norm:
        yield p + "self_attn.q_norm.weight", layer.q_norm, 0
        yield p + "self_attn.k_norm.weight", layer.k_norm, 0
    inter = args.intermediate_size
    for kind in ("weight", "bias") if args.mlp_bias else ("weight",):
        dest = layer.w_gate_up if kind == "weight" else layer.b_gate_up
        yield p + f"mlp.gate_proj.{kind}", dest, 0
        yield p + f"mlp.up_proj.{kind}", dest, inter
        down = layer.w_down if kind == "weight" else layer.b_down
        yield p + f"mlp.down_proj.{kind}", down, 0


def target_plan(args: ModelArgs, model: Transformer) -> Plan:
    yield "model.embed_tokens.weight", model.embed, 0
    yield "model.norm.weight", model.norm, 0
    if not args.tie_word_embeddings:
        yield "lm_head.weight", model.lm_head, 0
    for i, layer in enumerate(model.layers):
        yield from layer_plan(args, layer, f"model.layers.{i}.")


MULTIMODAL_PREFIX = "model.language_model."


def text_prefix(keys) -> str:
    """Where the text backbone's tensors live in this checkpoint."""
    return MULTIMODAL_PREFIX if MULTIMODAL_PREFIX + "embed_tokens.weight" in keys else "model."


def hybrid_plan(args: ModelArgs, model: Transformer, prefix: str) -> Plan:
    yield prefix + "embed_tokens.weight", model.embed, 0
    yield prefix + "norm.weight", model.norm, 0
    if not args.tie_word_embeddings:
        yield "lm_head.weight", model.lm_head, 0
    hy = args.hybrid
    assert hy is not None
    for i, layer in enumerate(model.layers):
        p = f"{prefix}layers.{i}."
        if not hy.linear(i):
            yield from layer_plan(args, layer, p)  # gated attention: q_proj carries the gate
            continue
        yield p + "input_layernorm.weight", layer.attn_norm, 0
        yield p + "post_attention_layernorm.weight", layer.ffn_norm, 0
        rows = 0
        for name, width in zip(("qkv", "z", "b", "a"), layer.splits, strict=True):
            yield p + f"linear_attn.in_proj_{name}.weight", layer.w_in, rows
            rows += width
        yield p + "linear_attn.conv1d.weight", layer.conv_w, 0
        yield p + "linear_attn.A_log", layer.a_log, 0
        yield p + "linear_attn.dt_bias", layer.dt_bias, 0
        yield p + "linear_attn.norm.weight", layer.out_norm, 0
        yield p + "linear_attn.out_proj.weight", layer.w_out, 0
        inter = args.intermediate_size
        yield p + "mlp.gate_proj.weight", layer.w_gate_up, 0
        yield p + "mlp.up_proj.weight", layer.w_gate_up, inter
        yield p + "mlp.down_proj.weight", layer.w_down, 0


def gemma4_plan(
    args: ModelArgs, model: Transformer, prefix: str, keys
) -> list[tuple[str, torch.Tensor, int, tuple[int, ...]]]:
    """Gemma 4's tensors under `prefix`, each with its destination, row offset and shape
    (layers differ in shape). KV-shared layers have no k/v tensors of their own (published
    copies are ignored); `layer_scalar` is read where the checkpoint has it (else 1)."""
    h = args.hidden_size
    out = [(prefix + "embed_tokens.weight", model.embed, 0, (args.vocab_size, h)),
           (prefix + "norm.weight", model.norm, 0, (h,))]  # fmt: skip
    if not args.tie_word_embeddings:
        out.append(("lm_head.weight", model.lm_head, 0, (args.vocab_size, h)))
    for i, layer in enumerate(model.layers):
        assert isinstance(layer, Gemma4Layer)
        p, d, q = f"{prefix}layers.{i}.", layer.head_dim, layer.q_rows
        kv, inter = layer.kv_heads * d, layer.w_down.shape[1]
        out += [(p + "input_layernorm.weight", layer.attn_norm, 0, (h,)),
                (p + "post_attention_layernorm.weight", layer.post_attn_norm, 0, (h,)),
                (p + "pre_feedforward_layernorm.weight", layer.ffn_norm, 0, (h,)),
                (p + "post_feedforward_layernorm.weight", layer.post_ffn_norm, 0, (h,)),
                (p + "self_attn.q_proj.weight", layer.wqkv, 0, (q, h)),
                (p + "self_attn.q_norm.weight", layer.q_norm, 0, (d,)),
                (p + "self_attn.o_proj.weight", layer.wo, 0, (h, q)),
                (p + "mlp.gate_proj.weight", layer.w_gate_up, 0, (inter, h)),
                (p + "mlp.up_proj.weight", layer.w_gate_up, inter, (inter, h)),
                (p + "mlp.down_proj.weight", layer.w_down, 0, (h, inter))]  # fmt: skip
        if not layer.shared:
            out += [(p + "self_attn.k_proj.weight", layer.wqkv, q, (kv, h)),
                    (p + "self_attn.k_norm.weight", layer.k_norm, 0, (d,))]  # fmt: skip
        if not layer.shared and not layer.k_is_v:
            out.append((p + "self_attn.v_proj.weight", layer.wqkv, q + kv, (kv, h)))
        if p + "layer_scalar" in keys:
            out.append((p + "layer_scalar", layer.layer_scalar, 0, (1,)))
    return out


def offset_norms(model: nn.Module) -> None:
    """Zero-centred norms: scale = 1 + w (fp32 parameters, so exact as transformers)."""
    weights = [model.norm]
    for layer in model.layers:
        weights += [layer.attn_norm, layer.ffn_norm]
        if isinstance(layer, DecoderLayer):
            weights += [layer.q_norm, layer.k_norm]
    for w in weights:
        w.data.add_(1.0)


def hybrid_shape(args: ModelArgs, key: str) -> tuple[int, ...] | None:
    """The shape of a Gated DeltaNet tensor under `args` (None: not one of theirs)."""
    hy = args.hybrid
    if hy is None or ".linear_attn." not in key:
        return None
    h, leaf = args.hidden_size, key.split(".linear_attn.")[-1]
    value_width = hy.value_heads * hy.value_dim
    return {
        "in_proj_qkv.weight": (hy.conv_dim, h),
        "in_proj_z.weight": (value_width, h),
        "in_proj_b.weight": (hy.value_heads, h),
        "in_proj_a.weight": (hy.value_heads, h),
        "conv1d.weight": (hy.conv_dim, 1, hy.conv_kernel),
        "A_log": (hy.value_heads,),
        "dt_bias": (hy.value_heads,),
        "norm.weight": (hy.value_dim,),
        "out_proj.weight": (h, value_width),
    }[leaf]


def shape_for(args: ModelArgs, key: str) -> tuple[int, ...]:
    """The shape the HF tensor `key` must have under `args` (for error messages)."""
    linear = hybrid_shape(args, key)
    if linear is not None:
        return linear
    h, d, inter = args.hidden_size, args.head_dim, args.intermediate_size
    rows = {
        "q_proj": args.num_heads * d * (2 if args.attn_output_gate else 1),
        "k_proj": args.num_kv_heads * d,
        "v_proj": args.num_kv_heads * d,
        "o_proj": h,
        "gate_proj": inter,
        "up_proj": inter,
        "down_proj": h,
    }
    leaf = key.split(".")[-2]
    if key.endswith("bias"):
        return (rows[leaf],)
    if leaf in ("q_norm", "k_norm"):
        return (d,)
    if key.endswith("layernorm.weight") or key.endswith("model.norm.weight"):
        return (h,)
    if key.endswith("language_model.norm.weight"):
        return (h,)
    if leaf in ("embed_tokens", "lm_head"):
        return (args.vocab_size, h)
    cols = {"o_proj": args.num_heads * d, "down_proj": inter}.get(leaf, h)
    return (rows[leaf], cols)
