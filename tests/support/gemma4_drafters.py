"""Tiny Gemma 4 drafters in the exact published layouts, for a tiny Gemma 4 target.

- DeepSpec's `Gemma4DSparkModel` (dspark_gemma4_12b_block7, and its plain DFlash block-7
  checkpoint: the same class without heads): the config is DeepSpec's `build_draft_config`
  applied to the target's text config, in the field set and spelling of the published
  12B config (fixtures/dspark-gemma4-12b-block7.config.json, transformers 5.10.2:
  `global_head_dim`, `num_global_key_value_heads`), the shapes scaled down to the target's;
  the tensors are its state dict's names (v_proj only without attention_k_eq_v,
  `layer_scalar` buffers, the embedding / LM head copies).
- z-lab's `DFlashDraftModel` for a Gemma target (Qwen3 layers): conftest's tiny z-lab
  drafter with the Gemma scalars z-lab's reference reads (`input_embedding_scale`,
  `output_multiplier`, `final_logit_softcapping`), in `dflash_config` or at the top.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from support.drafters import save_tiny_dflash
from support.targets import FIXTURES, TINY_VOCAB

DSPARK_12B = "dspark-gemma4-12b-block7.config.json"
DFLASH_12B = "dflash-gemma4-12b-block7.config.json"
MASK = TINY_VOCAB - 1
# the text fields a DeepSpec draft config copies from its target (build_draft_config)
COPIED = (
    "attention_bias", "attention_dropout", "bos_token_id", "eos_token_id", "pad_token_id",
    "final_logit_softcapping", "head_dim", "hidden_activation", "hidden_size",
    "hidden_size_per_layer_input", "intermediate_size", "max_position_embeddings",
    "num_attention_heads", "num_key_value_heads", "num_kv_shared_layers", "rms_norm_eps",
    "sliding_window", "use_double_wide_mlp", "vocab_size", "enable_moe_block",
)  # fmt: skip


def target_text(target: Path) -> dict:
    """The tiny target's text config, with the global layers' shape spelled as
    transformers 5.10.2 (DeepSpec's pin) writes it."""
    text = json.loads((target / "config.json").read_text())["text_config"]
    full = next(iter(text.get("per_layer_config", {}).values()), {})
    text.setdefault("global_head_dim", full.get("head_dim", text["head_dim"]))
    return text


def deepspec_config(
    target: Path,
    *,
    layers: int = 2,
    block_size: int = 7,
    taps: tuple[int, ...] = (1, 3),
    rank: int = 8,
    kind: str = "vanilla",
    confidence: bool = True,
    with_markov: bool = True,
    k_eq_v: bool = True,
    global_kv: int = 1,
) -> dict:
    """DeepSpec's draft config for the tiny target (`rank=0, confidence=False`: its DFlash)."""
    text = target_text(target)
    cfg = json.loads((FIXTURES / DSPARK_12B).read_text())
    cfg.update({k: text[k] for k in COPIED if k in text})
    cfg.update(
        attention_k_eq_v=k_eq_v,
        global_head_dim=text["global_head_dim"],
        num_global_key_value_heads=global_kv,
        vocab_size_per_layer_input=text["vocab_size"],
        target_model_type="gemma4",
        target_text_model_type="gemma4_text",
        num_target_layers=text["num_hidden_layers"],
        num_hidden_layers=layers,
        block_size=block_size,
        layer_types=["full_attention"] * layers,
        mask_token_id=MASK,
        target_layer_ids=list(taps),
        num_anchors=512,
        enable_confidence_head=confidence,
        markov_rank=rank,
    )
    cfg["rope_parameters"]["full_attention"] = text["rope_parameters"]["full_attention"]
    cfg.pop("confidence_head_with_markov")
    cfg.pop("markov_head_type")
    if confidence:
        cfg["confidence_head_with_markov"] = with_markov
    if rank:
        cfg["markov_head_type"] = kind
    return cfg


def target_embedding(target: Path) -> torch.Tensor:
    """The target's embedding table (tied: also its LM head), as stored."""
    (file,) = target.glob("*.safetensors")
    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor("model.language_model.embed_tokens.weight")


def save_deepspec_drafter(
    path: Path,
    target: Path,
    *,
    seed: int = 0,
    scale: float = 0.2,
    drop: str | None = None,
    edit: dict | None = None,
    **config,
) -> Path:
    """A random DeepSpec Gemma 4 drafter (DSpark or DFlash block-7) for the tiny target."""
    cfg = deepspec_config(target, **config)
    cfg.update(edit or {})
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    h, nq, inter = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    d, k_eq_v = cfg["global_head_dim"], cfg["attention_k_eq_v"]
    nkv = cfg["num_global_key_value_heads"] if k_eq_v else cfg["num_key_value_heads"]
    rank, vocab = cfg["markov_rank"], cfg["vocab_size"]
    tensors = {
        "fc.weight": rand(h, len(cfg["target_layer_ids"]) * h),
        "hidden_norm.weight": 1 + rand(h),
        "norm.weight": 1 + rand(h),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        for norm in ("input", "post_attention", "pre_feedforward", "post_feedforward"):
            tensors[p + f"{norm}_layernorm.weight"] = 1 + rand(h)
        tensors[p + "self_attn.q_proj.weight"] = rand(nq * d, h)
        tensors[p + "self_attn.k_proj.weight"] = rand(nkv * d, h)
        if not k_eq_v:
            tensors[p + "self_attn.v_proj.weight"] = rand(nkv * d, h)
        tensors[p + "self_attn.o_proj.weight"] = rand(h, nq * d)
        tensors[p + "self_attn.q_norm.weight"] = 1 + rand(d)
        tensors[p + "self_attn.k_norm.weight"] = 1 + rand(d)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.down_proj.weight"] = rand(h, inter)
        tensors[p + "layer_scalar"] = 0.5 + torch.rand(1, generator=gen)  # not 1: it must show
    if rank:  # a strong bigram bias, so the Markov head visibly changes what is drawn
        tensors["markov_head.markov_w1.weight"] = rand(vocab, rank) * 10
        tensors["markov_head.markov_w2.weight"] = rand(vocab, rank) * 10
    if cfg.get("enable_confidence_head"):
        width = h + (rank if cfg.get("confidence_head_with_markov") else 0)
        tensors["confidence_head.proj.weight"] = rand(1, width)
        tensors["confidence_head.proj.bias"] = torch.tensor([0.5])
    embed = target_embedding(target)  # DeepSpec ships copies of the target's
    tensors["embed_tokens.weight"] = embed.clone()
    tensors["lm_head.weight"] = embed.clone()
    if drop is not None:
        tensors.pop(drop)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    save_file({n: t.to(torch.bfloat16) for n, t in tensors.items()}, path / "model.safetensors")
    return path


def save_zlab_gemma_drafter(
    path: Path, target: Path, *, where: str = "dflash_config", multiplier: float = 1.0,
    block_size: int = 8, seed: int = 0,
) -> Path:  # fmt: skip
    """z-lab's DFlash layout (Qwen3 layers) for the tiny Gemma target, with the Gemma
    scalars of z-lab's reference: the block embedding scaled by sqrt(hidden) (z-lab embeds
    with the target's raw table), logits times `multiplier` and soft-capped at the target's
    cap. `where`: "dflash_config", "top" (the same scalars at the top level) or "none"."""
    text = target_text(target)
    save_tiny_dflash(
        path, hidden=text["hidden_size"], target_layer_ids=[1, 3],
        num_target_layers=text["num_hidden_layers"], block_size=block_size,
        mask_token_id=MASK, seed=seed,
    )  # fmt: skip
    cfg = json.loads((path / "config.json").read_text())
    scalars = {
        "input_embedding_scale": math.sqrt(text["hidden_size"]),
        "output_multiplier": multiplier,
        "final_logit_softcapping": text["final_logit_softcapping"],
    }
    if where == "dflash_config":
        cfg["dflash_config"].update(scalars)
    elif where == "top":
        cfg.update(scalars)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


def checkpoint_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A drafter's tensors by name, in fp32."""
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k).float() for k in f.keys()}


def eagle3_config(
    target: Path, *, layers: int = 1, taps: tuple[int, ...] = (0, 1, 2, 3, 4), k_eq_v: bool = True
) -> dict:
    """DeepSpec's `build_draft_config` for `Gemma4Eagle3Model` over the tiny target: its
    text config copied whole, the drafter's fields written over it (as for the 12B:
    attention_k_eq_v, one global KV head; five taps, the last layer's output not among
    them, as `assert_no_final_target_layer` requires)."""
    text = target_text(target)
    cfg = json.loads(json.dumps(text))
    cfg.update(
        architectures=["Gemma4Eagle3Model"],
        target_model_type="gemma4",
        target_text_model_type=text["model_type"],
        num_target_layers=text["num_hidden_layers"],
        num_hidden_layers=layers,
        layer_types=["full_attention"] * layers,
        target_model_name_or_path="tiny-gemma4",
        target_layer_ids=list(taps),
        ttt_length=7,
        step_loss_decay=0.8,
        draft_num_hidden_layers=layers,
        tie_word_embeddings=False,
        attention_k_eq_v=k_eq_v,
        num_global_key_value_heads=1,
    )
    return cfg


def target_head(target: Path) -> torch.Tensor:
    """The tiny target's LM head (untied), as stored."""
    (file,) = target.glob("*.safetensors")
    with safe_open(str(file), framework="pt") as f:
        return f.get_tensor("lm_head.weight")


def save_deepspec_eagle3(
    path: Path,
    target: Path,
    *,
    seed: int = 0,
    scale: float = 0.2,
    drop: str | None = None,
    edit: dict | None = None,
    **config,
) -> Path:
    """A random `Gemma4Eagle3Model` checkpoint for the tiny target, its state dict's names:
    `fc`, `layers.{i}.*` (q/k/v reading 2H, v_proj only without attention_k_eq_v, five
    norms, the `layer_scalar` buffer), `norm`, and copies of the target's embedding and
    head (`initialize_embeddings_and_head`)."""
    cfg = eagle3_config(target, **config)
    cfg.update(edit or {})
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen) * scale

    h, nq, inter = cfg["hidden_size"], cfg["num_attention_heads"], cfg["intermediate_size"]
    d, k_eq_v = cfg["global_head_dim"], cfg["attention_k_eq_v"]
    nkv = cfg["num_global_key_value_heads"] if k_eq_v else cfg["num_key_value_heads"]
    tensors = {
        "fc.weight": rand(h, len(cfg["target_layer_ids"]) * h),
        "norm.weight": 4 * (1 + rand(h)),  # logits spread out: no near-ties in the argmax
        "embed_tokens.weight": target_embedding(target).clone(),
        "lm_head.weight": target_head(target).clone(),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        for norm in ("hidden_norm", "input_layernorm", "post_attention_layernorm",
                     "pre_feedforward_layernorm", "post_feedforward_layernorm"):  # fmt: skip
            tensors[p + f"{norm}.weight"] = 1 + rand(h)
        tensors[p + "self_attn.q_proj.weight"] = rand(nq * d, 2 * h)
        tensors[p + "self_attn.k_proj.weight"] = rand(nkv * d, 2 * h)
        if not k_eq_v:
            tensors[p + "self_attn.v_proj.weight"] = rand(nkv * d, 2 * h)
        tensors[p + "self_attn.o_proj.weight"] = rand(h, nq * d)
        tensors[p + "self_attn.q_norm.weight"] = 1 + rand(d)
        tensors[p + "self_attn.k_norm.weight"] = 1 + rand(d)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.down_proj.weight"] = rand(h, inter)
        tensors[p + "layer_scalar"] = 0.5 + torch.rand(1, generator=gen)  # not 1: it must show
    if drop is not None:
        tensors.pop(drop)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    copies = ("embed_tokens.weight", "lm_head.weight")  # as the target stores them
    tensors = {n: t if n in copies else t.to(torch.bfloat16) for n, t in tensors.items()}
    save_file(tensors, path / "model.safetensors")
    return path
