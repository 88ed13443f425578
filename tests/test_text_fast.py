"""The cached tokenizer (text/tokenizer_cache.py) and the chat template rendered without
transformers (text/chat_template.py) against transformers itself: the same ids for raw
text and for conversations, the same decoded text, on the default model's tokenizer and
on the tiny one under each shipped family's chat template, with and without thinking."""

from __future__ import annotations

import copy
import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from specgen.core import once
from specgen.text import tokenizer_cache
from specgen.text.codec import TextCodec
from support.serve_stub import codec_with
from support.serve_tools import SPECIAL, template
from support.targets import tiny_tokenizer

TEXTS = [
    "Hello world",
    "Café, naïve, 東京, привет, 🙂 — multi-byte text",
    "  leading  spaces\n\n\ttabs and a trailing space ",
    "<|im_start|>user\nspecial tokens written in the text<|im_end|><|endoftext|>",
    "def add(a, b):\n    return a + b\n",
]


def conversations(text: str) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": text}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": text},
         {"role": "assistant", "content": "Sure: " + text}, {"role": "user", "content": "Again?"}],
    ]  # fmt: skip


def same_as_transformers(model_dir, name: str = "m") -> TextCodec:
    """A codec of `model_dir` from its cache, held to transformers' own tokenizer."""
    TextCodec(model_dir, name)  # the first load builds the cache
    codec = TextCodec(model_dir, name)
    assert codec.from_cache and codec._full is None  # nothing of transformers loaded
    full = AutoTokenizer.from_pretrained(str(model_dir))
    for text in TEXTS:
        ids = list(full(text)["input_ids"])
        assert codec.encode_raw(text) == ids, text
        bare = list(full(text, add_special_tokens=False)["input_ids"])
        assert codec.encode_raw(text, special=False) == bare, text
        for skip in (True, False):
            want = full.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)
            assert codec.decode(ids, skip_special=skip) == want, (text, skip)
        for messages in conversations(text):
            for think in (False, True):
                got = codec.encode_chat(messages, think=think)
                want = full.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=True,
                    enable_thinking=think,
                )["input_ids"]  # fmt: skip
                assert got == list(want), (text, think)
    assert full.eos_token_id in codec.stop_ids
    assert codec.vocab() == full.get_vocab()
    return codec


def test_the_default_models_tokenizer(embedded_dir):
    same_as_transformers(embedded_dir, "smollm2-135m")


@pytest.mark.parametrize("family", ["chatml", "qwen3", "qwen3.5", "llama-3.1", "gemma4"])
def test_the_tiny_tokenizer_under_each_familys_template(tmp_path, family):
    if family == "chatml":
        codec_with(tmp_path)
    else:
        codec_with(tmp_path, template(family), SPECIAL[family])
    same_as_transformers(tmp_path)


def test_what_the_cache_cannot_render_goes_through_transformers(tmp_path):
    """Messages with more than a role and text content (tool calls, a name, reasoning)
    are rendered by transformers itself, so they stay what transformers renders."""
    codec_with(tmp_path, template("qwen3"))
    codec = TextCodec(tmp_path, "m")
    assert codec.from_cache
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "", "reasoning_content": "thinking..."},
                {"role": "user", "content": "Hi again", "name": "bob"}]  # fmt: skip
    want = AutoTokenizer.from_pretrained(str(tmp_path)).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True,
        enable_thinking=False)["input_ids"]  # fmt: skip
    assert codec.encode_chat(messages) == list(want)
    assert codec._full is not None  # transformers' tokenizer, loaded for this


def test_the_cache_follows_the_files_and_a_damaged_one_is_rebuilt(tmp_path):
    codec_with(tmp_path)
    first = tokenizer_cache.cache_dir(tmp_path)
    TextCodec(tmp_path, "m")
    assert (first / "codec.json").is_file()
    tok = copy.deepcopy(tiny_tokenizer())
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}"
    tok.save_pretrained(tmp_path)  # another template: another cache
    assert tokenizer_cache.cache_dir(tmp_path) != first
    codec = TextCodec(tmp_path, "m")
    assert codec.from_cache
    assert codec.decode(codec.encode_chat([{"role": "user", "content": "x"}])) == "[x]"
    (tokenizer_cache.cache_dir(tmp_path) / "codec.json").write_text("{not json")
    again = TextCodec(tmp_path, "m")  # rebuilt, not an error
    assert again.from_cache and again.encode_raw("hello") == codec.encode_raw("hello")
    assert json.loads((tokenizer_cache.cache_dir(tmp_path) / "codec.json").read_text())


def test_a_tokenizer_with_its_own_encoding_is_not_cached(tmp_path):
    """A tokenizer class that encodes in Python of its own cannot be replayed from its
    backend: it keeps loading through transformers, and gives its own ids."""

    class Shouting(PreTrainedTokenizerFast):
        def _encode_plus(self, text, *args, **kwargs):
            return super()._encode_plus(text.upper(), *args, **kwargs)

    tok = Shouting(tokenizer_object=tiny_tokenizer().backend_tokenizer, eos_token="<|im_end|>")
    assert not tokenizer_cache.cacheable(tok)
    assert tokenizer_cache.cacheable(tiny_tokenizer())
    assert tokenizer_cache.save(tok, tmp_path) is None
    assert not tokenizer_cache.cache_dir(tmp_path).exists()


def test_the_first_load_says_it_built_the_tokenizer_once(tmp_path):
    tiny_tokenizer().save_pretrained(tmp_path)
    lines: list[str] = []
    with once.listening(lines.append):
        TextCodec(tmp_path, "tiny")
        TextCodec(tmp_path, "tiny")
    assert len(lines) == 1 and lines[0].startswith("built tiny's tokenizer in "), lines
    assert lines[0].endswith(f"s, once (cached in {tokenizer_cache.cache_dir(tmp_path).parent})")
