"""Prompt formatting and streaming detokenization."""

from __future__ import annotations

import pytest

from specgen.text.codec import Detokenizer, TextCodec

SAMPLES = [
    "Café, naïve, 東京, привет, 🙂 — multi-byte text for the tokenizer.",
    "plain ascii with  double  spaces and\nnewlines\n",
    "🙂🙂🙂 emoji only",
]


@pytest.fixture(scope="module")
def codec(tiny_llama):
    return TextCodec(tiny_llama, "tiny", config_eos=(2,))


@pytest.mark.parametrize("text", SAMPLES)
def test_streamed_text_equals_decoded_text_and_never_splits_a_character(codec, text):
    ids = codec.encode_raw(text)
    detok = Detokenizer(codec)
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == codec.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)


def test_a_cut_character_is_held_back_until_flush(codec):
    ids = codec.encode_raw("🙂")
    assert len(ids) > 1  # the byte-level tokenizer splits the emoji
    detok = Detokenizer(codec)
    assert detok.push(ids[:1]) == ""
    assert detok.flush() == codec.decode(ids[:1])  # what there is, at the very end


def test_chat_template_matches_transformers(codec):
    messages = [{"role": "user", "content": "Hello there"}]
    expected = codec.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    assert codec.encode_chat(messages) == list(expected)


def test_stop_ids_include_config_and_tokenizer_eos(codec):
    assert 2 in codec.stop_ids
    assert codec.tokenizer.convert_tokens_to_ids("<|im_end|>") in codec.stop_ids
