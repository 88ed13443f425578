"""Tiny random EAGLE-3 drafters saved in the exact published layouts (tensor names, config
fields), for an 8-layer tiny target (H 64, vocab 320, head dim 16).

- specforge: SpecForge's `configs/*-eagle3.json` shape (`LlamaForCausalLMEagle3`, Llama
  config, `draft_vocab_size`), tensors `midlayer.*`, `fc`, `norm`, `lm_head`, `d2t`, `t2d`,
  and `embed_tokens` (a copy SpecForge saves; specgen uses the target's).
- speculators: vLLM speculators' `Eagle3SpeculatorConfig` (`speculators_model_type`,
  `transformer_layer_config`, `speculators_config`), tensors `layers.{i}.*`.
- deepspec: DeepSpec's `build_draft_config` (the target's Qwen3 config extended with
  `Qwen3Eagle3Model`, 5 `target_layer_ids`, `ttt_length`), full vocabulary, copies of the
  target's embedding and head.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from support.targets import TINY_VOCAB, save_tiny

H, HEADS, KV, D, INTER = 64, 4, 2, 16, 128
TARGET_LAYERS = 8
TINY = dict(hidden=H, heads=HEADS, kv_heads=KV, head_dim=D, vocab=TINY_VOCAB)


def save_target(path: Path, family: str = "qwen3", seed: int = 11) -> Path:
    save_tiny(path, family, seed=seed, num_hidden_layers=TARGET_LAYERS)
    return path


def _llama_layer_config(layers: int, dims: dict, model_type: str = "llama") -> dict:
    h, heads, kv, d, vocab = (dims[k] for k in ("hidden", "heads", "kv_heads", "head_dim", "vocab"))
    return {
        "architectures": ["LlamaForCausalLM"] if model_type == "llama" else ["Qwen3ForCausalLM"],
        "model_type": model_type,
        "hidden_size": h,
        "intermediate_size": 2 * h,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": d,
        "num_hidden_layers": layers,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "tie_word_embeddings": False,
        "vocab_size": vocab,
        "attention_bias": False,
    }


def _layer(gen, prefix: str, fused: bool, qk_norm: bool, scale: float, dims: dict) -> dict:
    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    H, HEADS, KV, D = (dims[k] for k in ("hidden", "heads", "kv_heads", "head_dim"))  # noqa: N806
    INTER = 2 * H  # noqa: N806
    width = 2 * H if fused else H
    t = {
        prefix + "input_layernorm.weight": 1 + rand(H),
        prefix + "post_attention_layernorm.weight": 1 + rand(H),
        prefix + "self_attn.q_proj.weight": rand(HEADS * D, width),
        prefix + "self_attn.k_proj.weight": rand(KV * D, width),
        prefix + "self_attn.v_proj.weight": rand(KV * D, width),
        prefix + "self_attn.o_proj.weight": rand(H, HEADS * D),
        prefix + "mlp.gate_proj.weight": rand(INTER, H),
        prefix + "mlp.up_proj.weight": rand(INTER, H),
        prefix + "mlp.down_proj.weight": rand(H, INTER),
    }
    if fused:
        t[prefix + "hidden_norm.weight"] = 1 + rand(H)
    if qk_norm:
        t[prefix + "self_attn.q_norm.weight"] = 1 + rand(D)
        t[prefix + "self_attn.k_norm.weight"] = 1 + rand(D)
    return t


def draft_vocabulary(
    n: int, seed: int = 0, vocab: int = TINY_VOCAB
) -> tuple[torch.Tensor, torch.Tensor]:
    """SpecForge's maps for n used tokens: d2t[i] = used[i] - i, t2d[t] = t is used."""
    gen = torch.Generator().manual_seed(seed)
    used = torch.randperm(vocab, generator=gen)[:n].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    return used - torch.arange(n), t2d


def save_eagle3(
    path: Path,
    layout: str,
    *,
    target: Path | None = None,
    draft_vocab: int = 200,
    layers: int = 1,
    taps: list[int] | None = None,
    options: dict | None = None,
    edit: dict | None = None,
    tensors_edit: dict | None = None,
    drop: str | None = None,
    seed: int = 0,
    scale: float = 0.25,
    dims: dict | None = None,
) -> Path:
    """A random EAGLE-3 drafter in `layout`. `taps`: the config's explicit tap ids in that
    layout's own convention (None: the layout's default or, DeepSpec, [1, 2, 3, 4, 5])."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    options = options or {}
    dims = dims or TINY
    H, vocab = dims["hidden"], dims["vocab"]  # noqa: N806
    n_taps = 5 if layout == "deepspec" else len(taps) if taps else 3
    tensors: dict[str, torch.Tensor] = {
        "fc.weight": rand(H, n_taps * H),
        "norm.weight": 1 + rand(H),
    }
    if layout == "specforge":
        cfg = _llama_layer_config(1, dims)
        cfg.update(architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab)
        cfg["pad_token_id"] = 0
        if taps is not None:
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": taps}
        tensors.update(_layer(gen, "midlayer.", True, False, scale, dims))
        tensors["embed_tokens.weight"] = rand(vocab, H)  # SpecForge saves it; unused
    elif layout == "speculators":
        model_type = options.pop("model_type", "llama")
        cfg = {
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "transformer_layer_config": _llama_layer_config(layers, dims, model_type),
            "draft_vocab_size": draft_vocab,
            "norm_before_residual": False,
            "target_hidden_size": None,
            "norm_before_fc": False,
            "fc_norm": False,
            "norm_output": False,
            "embed_requires_grad": False,
            "has_no_defaults_at_init": False,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [
                    {
                        "proposal_type": "greedy",
                        "speculative_tokens": 3,
                        "verifier_accept_k": 1,
                        "accept_tolerance": 0.0,
                    }
                ],
                "verifier": {"name_or_path": "tiny-target", "architectures": ["Qwen3ForCausalLM"]},
            },
        }
        if taps is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = taps
        for i in range(layers):
            tensors.update(_layer(gen, f"layers.{i}.", i == 0, model_type == "qwen3", scale, dims))
    elif layout == "deepspec":
        assert target is not None, "DeepSpec's drafter copies the target's embedding and head"
        cfg = json.loads((target / "config.json").read_text())
        cfg.update(
            architectures=["Qwen3Eagle3Model"],
            num_target_layers=cfg["num_hidden_layers"],
            num_hidden_layers=layers,
            layer_types=["full_attention"] * layers,
            target_model_name_or_path="tiny-target",
            target_layer_ids=taps or [1, 2, 3, 4, 5],
            ttt_length=7,
            step_loss_decay=0.9,
            draft_num_hidden_layers=layers,
            tie_word_embeddings=False,
        )
        for i in range(layers):
            tensors.update(_layer(gen, f"layers.{i}.", True, True, scale, dims))
        own = load_file(str(target / "model.safetensors"))
        tensors["embed_tokens.weight"] = own["model.embed_tokens.weight"].float()
        tensors["lm_head.weight"] = own["lm_head.weight"].float()
    else:
        raise ValueError(layout)
    if layout != "deepspec":
        tensors["lm_head.weight"] = rand(draft_vocab, H)
        d2t, t2d = draft_vocabulary(draft_vocab, seed, vocab)
        tensors["d2t"], tensors["t2d"] = d2t, t2d
    for key, value in options.items():  # e.g. fc_norm, norm_before_residual, norm_output
        cfg[key] = value
    if options.get("fc_norm"):
        for j in range(n_taps):
            tensors[f"fc_norm.{j}.weight"] = 1 + rand(H)
    if options.get("norm_before_fc"):
        tensors["input_norm.weight"] = 1 + rand(n_taps * H)
    cfg.update(edit or {})
    tensors.update(tensors_edit or {})
    if drop is not None:
        tensors.pop(drop)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    floats = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in tensors.items()}
    save_file(floats, path / "model.safetensors")
    return path


# (layout, save_eagle3 arguments): every layout, and the options each one's configs carry
VARIANTS = {
    "specforge": ("specforge", {}),
    "specforge-explicit-taps": ("specforge", {"taps": [1, 4, 6]}),
    "specforge-fc-norm-raw-logits": (
        "specforge",
        {"options": {"fc_norm": True, "norm_output": False}},
    ),
    "speculators": ("speculators", {}),
    "speculators-qwen3-2-layers": (
        "speculators",
        {
            "layers": 2,
            "taps": [2, 5, 7],
            "options": {"model_type": "qwen3", "norm_before_residual": True},
        },
    ),
    "speculators-eagle3.1": (
        "speculators",
        {"options": {"norm_output": True, "norm_before_fc": True}},
    ),
    "deepspec": ("deepspec", {}),
    "deepspec-2-layers": ("deepspec", {"layers": 2, "taps": [0, 2, 3, 5, 6]}),
}
