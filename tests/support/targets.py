"""Tiny seeded target checkpoints in the real HF layouts (Llama, Qwen2, Qwen3, Mistral,
Qwen3.5, Gemma 4), their byte-level BPE tokenizer with a ChatML template, and the
published configs under `fixtures/`."""

from __future__ import annotations

from pathlib import Path

import torch

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


def save_tiny_qwen3_5(
    path: Path,
    seed: int = 0,
    *,
    layers: int = 6,
    mtp_layers: int = 0,
    echo: float | None = None,
    **text_overrides,
):
    """A random tiny Qwen3.5 saved as published: the multimodal
    `Qwen3_5ForConditionalGeneration` (vision tower included, text under
    `model.language_model.`), with every norm weight perturbed (its zero-centred norms
    would otherwise hide a missing 1 + w), plus the tiny tokenizer. Returns the model.

    `mtp_layers`: the checkpoint also carries that many multi-token-prediction layers in
    the published names (`mtp.*`, config `mtp_num_hidden_layers`; transformers ignores
    them). `echo`: every layer's output projections (target and MTP) are scaled by it and
    the MTP's fc reads the embedding half, so both mostly predict from the last token
    alone and MTP drafts are mostly accepted (long accepted chains to test)."""
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
            if echo is not None and name.endswith(ECHOED):
                weight.mul_(echo)
    model.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    if mtp_layers:
        _add_mtp(path, model, mtp_layers, echo)
    return model


# a layer's output projections: what `echo` scales
ECHOED = ("o_proj.weight", "down_proj.weight", "out_proj.weight")


def mtp_weights(model, layers: int, echo: float | None = None) -> dict[str, torch.Tensor]:
    """Random Qwen3.5 MTP layers for `model` (a Qwen3_5ForConditionalGeneration), named as
    published: `mtp.fc` [H, 2H] over cat(embedding, hidden), its two zero-centred pre-fc
    norms, `mtp.layers.{i}.*` full-attention decoder layers (gated q_proj, q/k norms) and
    `mtp.norm`. With `echo`, fc passes the normed embedding through and the final norm is
    the target's, so the head predicts what the target predicts after that token."""
    text = model.config.text_config
    h, d, inter = text.hidden_size, text.head_dim, text.intermediate_size
    nq, nkv = text.num_attention_heads, text.num_key_value_heads
    std = text.initializer_range

    def mat(rows, cols, scale=1.0):
        return torch.randn(rows, cols) * std * scale

    def norm(n):  # zero-centred: the scale is 1 + w
        return torch.randn(n) * 0.1

    out = {
        "mtp.fc.weight": mat(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": norm(h),
        "mtp.pre_fc_norm_hidden.weight": norm(h),
        "mtp.norm.weight": norm(h),
    }
    small = 1.0 if echo is None else echo
    for i in range(layers):
        p = f"mtp.layers.{i}."
        out |= {
            p + "input_layernorm.weight": norm(h),
            p + "post_attention_layernorm.weight": norm(h),
            p + "self_attn.q_proj.weight": mat(2 * nq * d, h),  # each head's query, then gate
            p + "self_attn.k_proj.weight": mat(nkv * d, h),
            p + "self_attn.v_proj.weight": mat(nkv * d, h),
            p + "self_attn.o_proj.weight": mat(h, nq * d, small),
            p + "self_attn.q_norm.weight": norm(d),
            p + "self_attn.k_norm.weight": norm(d),
            p + "mlp.gate_proj.weight": mat(inter, h),
            p + "mlp.up_proj.weight": mat(inter, h),
            p + "mlp.down_proj.weight": mat(h, inter, small),
        }
    if echo is not None:
        out["mtp.fc.weight"] = torch.cat([torch.eye(h), torch.zeros(h, h)], dim=1)
        out["mtp.pre_fc_norm_embedding.weight"] = torch.zeros(h)
        out["mtp.norm.weight"] = model.model.language_model.norm.weight.detach().clone()
    return out


def _add_mtp(path: Path, model, layers: int, echo: float | None) -> None:
    """Write the MTP layers into the saved checkpoint, as the published ones carry them."""
    import json

    from safetensors.torch import load_file, save_file

    torch.manual_seed(1000 + layers)
    weights = path / "model.safetensors"
    tensors = load_file(str(weights))
    tensors.update(mtp_weights(model, layers, echo))
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = layers
    (path / "config.json").write_text(json.dumps(config, indent=2))


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


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


GEMMA4_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2


GEMMA_TURNS = (  # Gemma's turn format, as google/gemma-3-*-it's template writes it
    "{{ bos_token }}{% for m in messages %}<start_of_turn>"
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n{{ m['content'] | trim }}"
    "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def save_tiny_gemma3(path: Path, seed: int = 0, *, multimodal: bool = False, **text_overrides):
    """A random tiny Gemma 3 saved as published: text-only `Gemma3ForCausalLM` (the 270M's
    and 1B's layout) or, with `multimodal`, `Gemma3ForConditionalGeneration` (the 4B's and
    up: a SigLIP tower and projector beside the text model under `model.language_model.`),
    plus the tiny tokenizer. Six layers of pattern 3 (layers 2 and 5 global) by default, a
    sliding window of 4 (verify blocks cross it), the local RoPE base 10000 against a
    global one linearly scaled (as the 4B's), query_pre_attn_scalar 24 (not the head dim:
    a wrong scale shows). Untied by default (published models tie; a random tied model
    mostly repeats its last token). Every norm weight is perturbed around 0 (Gemma's 1 + w:
    a norm read as w shows). A GGUF can hold only llama.cpp's Gemma 3 (pattern 6, the head
    dim as query_pre_attn_scalar): `GGUF_GEMMA3` overrides make one. Returns the model."""
    import transformers

    text = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        sliding_window=4,
        sliding_window_pattern=3,
        rope_theta=1e5,
        rope_local_base_freq=10_000.0,
        rope_scaling={"rope_type": "linear", "factor": 4.0},
        max_position_embeddings=512,
        eos_token_id=2,
        pad_token_id=0,
        bos_token_id=None,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked logits: greedy ties would make tests flaky
    )
    text.update(text_overrides)
    torch.manual_seed(seed)
    if multimodal:
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, image_size=16, patch_size=4)  # fmt: skip
        config = transformers.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4,
            tie_word_embeddings=text["tie_word_embeddings"],
        )  # fmt: skip
        model = transformers.Gemma3ForConditionalGeneration(config).eval()
        backbone = model.model.language_model
    else:
        model = transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**text)).eval()
        backbone = model.model
    with torch.no_grad():
        for name, weight in backbone.named_parameters():
            if "norm" in name:  # zeros at init: a norm read as w instead of 1 + w shows
                weight.normal_(0.0, 0.2).clamp_(-0.45, 0.45)  # 1 + w - 1 stays exact
    model.save_pretrained(path)
    tok = tiny_tokenizer()
    tok.save_pretrained(path)
    (path / "chat_template.jinja").write_text(GEMMA_TURNS)
    return model


# what llama.cpp's gemma3 architecture can hold (support/llamacpp_convert.py)
GGUF_GEMMA3 = dict(sliding_window_pattern=6, query_pre_attn_scalar=16)
