"""The fast start of `generate` (api/quick.py): a greedy AR answer from a fused pass's image,
without torch, that must be the full load's token for token."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.api.quick import image_key, image_path, open_quick, write_image
from specgen.core.errors import ContextLimitError
from specgen.hub import resolve_model
from specgen.kernels.packed import cpu_library
from specgen.models.fused.image import Image
from support.cold_start import imported, run_cli
from support.packed import LLAMA_MIXES, write_tiny_gguf

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")

PROMPTS = ["Hello there", "Hello there, how", "A different start entirely"]


def full_and_quick(gguf, context=64):
    pipe = Pipeline.load(str(gguf), device="cpu", context=context)
    written = write_image(pipe.model, gguf)
    assert written is not None
    quick = open_quick(resolve_model(str(gguf)), context, None, None)
    assert quick is not None
    return pipe, quick


def answer(pipe, prompt, n=12):
    ids = pipe.encode(prompt)
    chunks = list(pipe.stream_ids(ids, max_new_tokens=n))
    tokens = [t for c in chunks for t in c.token_ids]
    return tokens, chunks[-1].stats


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m", "q8_0", "q5"])
def test_the_quick_answer_is_the_full_loads(tiny_dirs, tmp_path, family, mix):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs[family], gguf, LLAMA_MIXES[mix])
    pipe, quick = full_and_quick(gguf)
    for prompt in PROMPTS:  # one after another: each keeps the prefix it shares
        want, want_stats = answer(pipe, prompt)
        got, got_stats = answer(quick, prompt)
        assert got == want, prompt
        assert (got_stats.prefill_tokens, got_stats.finish_reason) == (
            want_stats.prefill_tokens, want_stats.finish_reason), prompt  # fmt: skip
        assert quick.encode(prompt, raw=True) == pipe.encode(prompt, raw=True)


def test_the_image_holds_the_passes_bytes_and_the_embedding(tiny_dirs, tmp_path):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["qwen3"], gguf, LLAMA_MIXES["q4_1"])
    pipe, quick = full_and_quick(gguf)
    ids = list(range(0, pipe.model.args.vocab_size, 7))
    want = pipe.model.embed_tokens(torch.tensor([ids]))[0].numpy()
    assert np.array_equal(quick.image.embed(ids), want)
    # a decode step's logits, bit for bit
    cache = pipe.model.new_cache(64)
    torch_logits = pipe.model(torch.tensor([[5, 9, 13]]), cache).logits[0, -1].numpy()
    assert np.array_equal(quick._pass([5, 9, 13])[0], torch_logits)


def test_the_context_limit_and_stops_are_the_full_loads(tiny_dirs, tmp_path):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["llama"], gguf, LLAMA_MIXES["q4_1"])
    pipe, quick = full_and_quick(gguf, context=24)
    long = " ".join(["word"] * 40)
    for p in (pipe, quick):
        with pytest.raises(ContextLimitError, match="the context limit is 24"):
            answer(p, long)
    # an answer the context cuts short ends alike
    want, want_stats = answer(pipe, "Hi", n=200)
    got, got_stats = answer(quick, "Hi", n=200)
    assert got == want and got_stats.finish_reason == want_stats.finish_reason


def test_a_cut_image_or_another_key_is_no_image(tiny_dirs, tmp_path, monkeypatch):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["llama"], gguf, LLAMA_MIXES["q4_1"])
    full_and_quick(gguf)
    path = image_path(image_key(gguf))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    assert Image.open(path) is None
    assert open_quick(resolve_model(str(gguf)), 64, None, None) is None
    path.write_bytes(data)
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # what the products multiply: another key
    assert open_quick(resolve_model(str(gguf)), 64, None, None) is None


@pytest.mark.slow
def test_generate_starts_without_torch_once_the_image_is_written(tiny_dirs, tmp_path):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["qwen3"], gguf, LLAMA_MIXES["q4_1"])
    env = {"SPECGEN_HOME": str(tmp_path / "home")}
    args = ("generate", "Hello there", "--model", str(gguf), "-n", "10", "--json")
    first = run_cli(*args, env=env)
    assert first.returncode == 0, first.stderr
    assert "built a fast-start image" in first.stderr
    assert "torch" in imported(first)
    second = run_cli(*args, env=env)
    assert second.returncode == 0, second.stderr
    assert "torch" not in imported(second) and "transformers" not in imported(second)
    assert "built" not in second.stderr
    record = json.loads(second.stdout.splitlines()[0])
    want = json.loads(first.stdout.splitlines()[0])
    assert record["token_ids"] == want["token_ids"] and record["text"] == want["text"]
    assert set(record["stats"]) == set(want["stats"])
    for key in ("prompt_tokens", "prefill_tokens", "new_tokens", "steps", "finish_reason",
                "drafted_tokens", "acceptance_length"):  # fmt: skip
        assert record["stats"][key] == want["stats"][key], key
    # what an image cannot answer loads as before
    for more in (("--temperature", "0.7", "--seed", "1"), ("--method", "ngram"),
                 ("--dequantize",)):  # fmt: skip
        done = run_cli(*args, *more, env=env)
        assert done.returncode == 0, (more, done.stderr)
        assert "torch" in imported(done), more


@pytest.mark.slow
def test_an_image_that_cannot_be_written_costs_the_answer_nothing(tiny_dirs, tmp_path):
    gguf = tmp_path / "t.gguf"
    write_tiny_gguf(tiny_dirs["llama"], gguf, LLAMA_MIXES["q4_1"])
    home = tmp_path / "home"
    home.mkdir()
    (home / "fast").write_text("not a directory")  # where images go: unusable
    done = run_cli("generate", "Hello there", "--model", str(gguf), "-n", "6",
                   env={"SPECGEN_HOME": str(home)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "no fast-start image written" in done.stderr
    assert not done.stdout.strip().splitlines()[0].startswith("imported:")  # the answer
