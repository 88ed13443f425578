"""Tiny seeded drafter checkpoints in the published layouts: z-lab's DFlash and DFlash 2,
DeepSpec's DSpark (config.json as the fixtures publish it, random weights)."""

from __future__ import annotations

from pathlib import Path

import torch

from support.targets import FIXTURES, TINY_VOCAB


def save_tiny_dflash(
    path: Path,
    *,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    vocab: int = TINY_VOCAB,
    layers: int = 2,
    block_size: int = 8,
    mask_token_id: int = TINY_VOCAB - 1,
    target_layer_ids: list[int] | None = None,
    num_target_layers: int = 6,
    layer_types: list[str] | None = None,
    sliding_window: int | None = None,
    drop: str | None = None,
    seed: int = 0,
    scale: float = 0.2,
) -> Path:
    """A random DFlash drafter in exactly z-lab's layout: the real b16 config, scaled down."""
    import json

    from safetensors.torch import save_file

    cfg = json.loads((FIXTURES / "dflash-qwen3-4b-b16.config.json").read_text())
    cfg.update(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        block_size=block_size,
        num_target_layers=num_target_layers,
        layer_types=layer_types or ["full_attention"] * layers,
        sliding_window=sliding_window,
        use_sliding_window=sliding_window is not None,
        max_window_layers=layers,
    )
    cfg["dflash_config"] = {"mask_token_id": mask_token_id}
    if target_layer_ids is not None:
        cfg["dflash_config"]["target_layer_ids"] = target_layer_ids
    k = len(target_layer_ids) if target_layer_ids is not None else layers
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    tensors = {
        "fc.weight": rand(hidden, k * hidden),
        "hidden_norm.weight": 1 + rand(hidden),
        "norm.weight": 1 + rand(hidden),
    }
    inter = 2 * hidden
    for i in range(layers):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": 1 + rand(hidden),
                p + "post_attention_layernorm.weight": 1 + rand(hidden),
                p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": 1 + rand(head_dim),
                p + "self_attn.k_norm.weight": 1 + rand(head_dim),
                p + "mlp.gate_proj.weight": rand(inter, hidden),
                p + "mlp.up_proj.weight": rand(inter, hidden),
                p + "mlp.down_proj.weight": rand(hidden, inter),
            }
        )
    if drop is not None:
        tensors.pop(drop)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({n: t.to(torch.bfloat16) for n, t in tensors.items()}, path / "model.safetensors")
    return path


def save_tiny_dflash2(
    path: Path,
    *,
    kernel: int = 2,
    group: int = 16,
    rank: int = 8,
    top_k: int = 6,
    codebook_rows: int | None = None,
    edit: dict | None = None,
    drop_fields: tuple[str, ...] = (),
    seed: int = 0,
    **dflash,
) -> Path:
    """A random DFlash 2 drafter in exactly z-lab's layout (PyPI `dflash` 0.1.0): the
    SpecForge / Qwen3.8-27B config scaled down, DFlash's tensors plus both convolutions
    of every layer and the candidate selector (codebooks saved without `.weight`).
    `codebook_rows` gives the codebooks another vocabulary; `edit` overrides config keys;
    `drop_fields` removes dflash_config keys."""
    import json

    from safetensors.torch import load_file, save_file

    dflash.setdefault("target_layer_ids", [1, 3])
    save_tiny_dflash(path, seed=seed, **dflash)
    base = json.loads((path / "config.json").read_text())
    cfg = json.loads((FIXTURES / "dflash2-qwen3.6-27b.config.json").read_text())
    keep = ("architectures", "is_causal", "dflash_config", "rope_parameters")
    cfg = {**base, **{k: cfg[k] for k in keep}}
    cfg.pop("rope_theta", None)
    cfg.pop("block_size", None)
    cfg["layer_types"] = base["layer_types"]
    cfg["sliding_window"] = base["sliding_window"]
    cfg["use_sliding_window"] = base["use_sliding_window"]
    cfg["dflash_config"] = {
        **cfg["dflash_config"],
        **base["dflash_config"],
        "block_size": base["block_size"],
        "conv_kernel_size": kernel,
        "conv_group_size": group,
        "selector_rank": rank,
        "selector_top_k": top_k,
    }
    for key in drop_fields:
        cfg["dflash_config"].pop(key)
    cfg.update(edit or {})
    hidden, vocab = base["hidden_size"], codebook_rows or base["vocab_size"]
    gen = torch.Generator().manual_seed(seed + 1)

    def rand(*shape, scale=0.2):
        return torch.randn(*shape, generator=gen) * scale

    tensors = load_file(path / "model.safetensors")
    for i in range(base["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            p = f"layers.{i}.{conv}."
            # base taps near the identity (tap 0 around 1), so the layer stays well scaled
            kernel_init = rand(2, kernel, hidden)
            kernel_init[:, 0] += 1
            tensors[p + "base_kernel"] = kernel_init
            tensors[p + "kernel_projection.weight"] = rand(2 * kernel * (hidden // group), hidden)
    # strong codebooks: the chain walk visibly departs from the per-slot argmax
    tensors["candidate_selector.predecessor_codebook"] = rand(vocab, rank, scale=1.5)
    tensors["candidate_selector.successor_codebook"] = rand(vocab, rank, scale=1.5)
    tensors["candidate_selector.hidden_projection.weight"] = rand(rank, hidden, scale=0.5)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({n: t.to(torch.bfloat16) for n, t in tensors.items()}, path / "model.safetensors")
    return path


def save_tiny_dspark(
    path: Path,
    *,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    vocab: int = TINY_VOCAB,
    layers: int = 2,
    block_size: int = 7,
    rank: int = 8,
    kind: str = "vanilla",
    confidence: bool = True,
    with_markov: bool = True,
    conf_bias: bool = True,
    anchor_first: bool = True,
    copies: bool = True,
    target_layer_ids: list[int] | None = None,
    num_target_layers: int = 6,
    edit: dict | None = None,
    drop: str | None = None,
    reshape: tuple[str, tuple[int, ...]] | None = None,
    seed: int = 0,
    scale: float = 0.2,
) -> Path:
    """A random DSpark drafter in exactly DeepSpec's layout: the fixture config, scaled down.

    `rank=0, confidence=False` gives DeepSpec's plain DFlash checkpoints (same class).
    """
    import json

    from safetensors.torch import save_file

    ids = target_layer_ids or [1, 3]
    cfg = json.loads((FIXTURES / "dspark-qwen3-4b-block7.config.json").read_text())
    cfg.update(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        num_hidden_layers=layers,
        max_position_embeddings=4096,
        max_window_layers=layers,
        block_size=block_size,
        num_target_layers=num_target_layers,
        layer_types=["full_attention"] * layers,
        mask_token_id=vocab - 1,
        target_layer_ids=ids,
        markov_rank=rank,
        markov_head_type=kind,
        enable_confidence_head=confidence,
        confidence_head_with_markov=with_markov,
    )
    if not anchor_first:
        del cfg["num_anchors"]
    cfg.update(edit or {})
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    inter = 2 * hidden
    tensors = {
        "fc.weight": rand(hidden, len(ids) * hidden),
        "hidden_norm.weight": 1 + rand(hidden),
        "norm.weight": 1 + rand(hidden),
    }
    for i in range(layers):
        p = f"layers.{i}."
        tensors.update(
            {
                p + "input_layernorm.weight": 1 + rand(hidden),
                p + "post_attention_layernorm.weight": 1 + rand(hidden),
                p + "self_attn.q_proj.weight": rand(heads * head_dim, hidden),
                p + "self_attn.k_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.v_proj.weight": rand(kv_heads * head_dim, hidden),
                p + "self_attn.o_proj.weight": rand(hidden, heads * head_dim),
                p + "self_attn.q_norm.weight": 1 + rand(head_dim),
                p + "self_attn.k_norm.weight": 1 + rand(head_dim),
                p + "mlp.gate_proj.weight": rand(inter, hidden),
                p + "mlp.up_proj.weight": rand(inter, hidden),
                p + "mlp.down_proj.weight": rand(hidden, inter),
            }
        )
    if rank:
        # a strong bigram bias, so the Markov head visibly changes what is drawn
        tensors["markov_head.markov_w1.weight"] = rand(vocab, rank) * 10
        tensors["markov_head.markov_w2.weight"] = rand(vocab, rank) * 10
    if rank and kind == "gated":
        tensors["markov_head.gate_proj.weight"] = rand(rank, hidden + rank)
        tensors["markov_head.gate_proj.bias"] = rand(rank)
    if rank and kind == "rnn":
        tensors["markov_head.joint_proj.weight"] = rand(3 * rank, 2 * rank + hidden)
        tensors["markov_head.joint_proj.bias"] = rand(3 * rank)
    if confidence:
        tensors["confidence_head.proj.weight"] = rand(1, hidden + (rank if with_markov else 0))
        if conf_bias:
            tensors["confidence_head.proj.bias"] = torch.tensor([0.5])
    if copies:  # DeepSpec ships the target's embedding and head; specgen skips them
        tensors["embed_tokens.weight"] = rand(vocab, hidden)
        tensors["lm_head.weight"] = rand(vocab, hidden)
    if drop is not None:
        tensors.pop(drop)
    if reshape is not None:
        tensors[reshape[0]] = rand(*reshape[1])
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file({n: t.to(torch.bfloat16) for n, t in tensors.items()}, path / "model.safetensors")
    return path
