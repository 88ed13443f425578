"""Several answers' rows in one fused CPU pass (`Transformer.forward_shared`, decoder.c's
`decoder_forward_many`): each answer's logits, taps and cache are the bits its own forward
gives, whatever else shares the pass, in any thread count; and answers stepped together on
a packed target share it, each answer the one it is alone."""

from __future__ import annotations

import pytest
import torch

from specgen.api.streams import Streams
from specgen.core.config import SamplingParams, SpecConfig
from specgen.kernels.packed import cpu_library
from specgen.models.fused.cpu_pass import FusedPass
from specgen.models.loading import load_gguf_target
from support.packed import LLAMA_MIXES, write_tiny_gguf

pytestmark = pytest.mark.skipif(cpu_library() is None, reason="no C compiler")

# (prompt length already cached, rows this step, num_logits): a decode step, a verify
# block, a prefill chunk after nothing, one after something, a block past the direct path
PARTS = [(7, 1, None), (12, 5, None), (0, 9, 1), (3, 6, 1), (20, 18, None)]


def packed(tiny_qwen3_deep, tmp_path, mix):
    write_tiny_gguf(tiny_qwen3_deep, tmp_path / "t.gguf", LLAMA_MIXES[mix])
    return load_gguf_target(tmp_path / "t.gguf", tiny_qwen3_deep, dtype=torch.float32, device="cpu")


def prepared(model, seed: int):
    """Each part's cache after its prompt, and its step's tokens."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for before, rows, num in PARTS:
        cache = model.new_cache(64, steps=20)
        if before:
            model(torch.randint(0, model.args.vocab_size, (1, before), generator=gen), cache)
        tokens = torch.randint(0, model.args.vocab_size, (rows,), generator=gen).tolist()
        out.append((tokens, cache, num))
    return out


@pytest.mark.parametrize("mix", ["q4_1", "q4_k_m"])
@pytest.mark.parametrize("act", ["fp32", "q8"])
def test_each_answers_rows_in_a_shared_pass_are_its_own(tiny_qwen3_deep, tmp_path, mix, act,
                                                        monkeypatch):  # fmt: skip
    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    model = packed(tiny_qwen3_deep, tmp_path, mix)
    taps = (0, model.args.num_layers - 1)
    alone = []
    for tokens, cache, num in prepared(model, 3):
        out = model(torch.tensor([tokens]), cache, taps=taps, num_logits=num)
        alone.append((out, cache))
    fused = FusedPass.of(model)
    assert fused is not None
    fused.min_parallel_work, fused.tuner = 0, None  # share even a tiny model's phases
    threads = torch.get_num_threads()
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            parts = prepared(model, 3)
            for (tokens, cache, _), (_, done) in zip(parts, alone, strict=True):
                assert cache.length + len(tokens) == done.length  # the same prompts
            outs = model.forward_shared(parts, taps)
            for (out, done), got, (tokens, cache, num) in zip(alone, outs, parts, strict=True):
                assert got.logits.shape == (1, num or len(tokens), model.args.vocab_size)
                assert torch.equal(got.logits, out.logits), (n, len(tokens))
                for i in taps:
                    assert torch.equal(got.taps[i], out.taps[i]), (n, i)
                assert cache.length == done.length
                assert torch.equal(cache.k[..., : cache.length, :], done.k[..., : done.length, :])
                assert torch.equal(cache.v[..., : cache.length, :], done.v[..., : done.length, :])
    finally:
        torch.set_num_threads(threads)


def test_a_part_that_cannot_share_the_pass_is_not_offered(tiny_qwen3_deep, tmp_path):
    model = packed(tiny_qwen3_deep, tmp_path, "q4_1")
    cache = model.new_cache(8)
    assert model.shares_pass(cache, 8)
    assert not model.shares_pass(cache, 9)  # past its capacity: its own forward says so
    assert not model.shares_pass(model.new_cache(8, batch=2), 1)  # a padded batch's cache


@pytest.mark.integration
@pytest.mark.parametrize("act", ["fp32", "q8"])
@pytest.mark.parametrize("method", ["ar", "ngram", "dflash", "stacked"])
def test_answers_stepped_together_share_the_pass_and_answer_as_alone(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark, tmp_path, method, act, monkeypatch
):
    from specgen.api.loader import Decoding, Target
    from specgen.api.pipeline import Pipeline

    monkeypatch.setenv("SPECGEN_CPU_ACT", act)
    model = packed(tiny_qwen3_deep, tmp_path, "q4_1")
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    ar = Pipeline._of(Target(model, base.codec, "tiny-gguf", base.context, "test"),
                      Decoding(SpecConfig()))  # fmt: skip
    drafter = {"dflash": str(tiny_dflash), "stacked": (str(tiny_dflash), str(tiny_dspark))}
    pipe = (
        ar
        if method == "ar"
        else ar.with_spec(
            SpecConfig(method=method, drafter=drafter.get(method), verify_policy="full")
        )
    )
    prompts = ["The quick brown fox", "one two one two one two", "Hello", "a b c d e f g"]
    lengths = [16, 9, 20, 5]
    seeded = SamplingParams(temperature=0.8, top_k=20, seed=5)
    shared: list[int] = []  # the answers in each shared pass
    real = FusedPass.run_many

    def counted(self, model, parts, taps):
        shared.append(len(parts))
        return real(self, model, parts, taps)

    for sampling in (None, seeded):
        want = []
        for prompt, n in zip(prompts, lengths, strict=True):
            ids, out = pipe.encode(prompt, raw=True), []
            for chunk in pipe.stream_ids(ids, session=pipe.new_session(), sampling=sampling,
                                         max_new_tokens=n):  # fmt: skip
                out += chunk.token_ids
            want.append(out)
        shared.clear()
        monkeypatch.setattr(FusedPass, "run_many", counted)
        streams, got, opened = Streams(pipe, parallel=3), {}, {}
        waiting = list(range(len(prompts)))
        while waiting or streams.active:
            while waiting and streams.free:
                i = waiting.pop(0)
                stream = streams.open(pipe.encode(prompts[i], raw=True), sampling=sampling,
                                      max_new_tokens=lengths[i])  # fmt: skip
                opened[id(stream)] = i
            for stream, chunk in streams.step():
                assert not isinstance(chunk, Exception), chunk
                got.setdefault(opened[id(stream)], []).extend(chunk.token_ids)
        monkeypatch.setattr(FusedPass, "run_many", real)
        assert [got[i] for i in range(len(prompts))] == want, sampling
        assert max(shared) == 3  # three answers did share passes


def test_separate_passes_on_request(tiny_qwen3_deep, tmp_path, monkeypatch):
    model = packed(tiny_qwen3_deep, tmp_path, "q4_1")
    assert model.shared_passes and model.shares_pass(model.new_cache(8), 1)
    monkeypatch.setenv("SPECGEN_CPU_PASS", "separate")  # each answer its own fused pass
    assert not model.shared_passes and not model.shares_pass(model.new_cache(8), 1)
    assert FusedPass.of(model) is not None


def test_streams_read_prompts_in_short_chunks_with_the_bits_of_one_forward(
    tiny_qwen3_deep, tmp_path, monkeypatch
):
    """On a shared pass a prompt is read 64 rows a step (a request sent meanwhile waits for
    one short step), and its answer is the one a single 512-row forward gives."""
    from specgen.api.loader import Decoding, Target
    from specgen.api.pipeline import Pipeline
    from specgen.engine.prefill import SHARED_CHUNK

    model = packed(tiny_qwen3_deep, tmp_path, "q4_1")
    base = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    pipe = Pipeline._of(Target(model, base.codec, "tiny-gguf", base.context, "test"),
                        Decoding(SpecConfig()))  # fmt: skip
    ids = pipe.encode(" ".join(f"w{i % 37}" for i in range(40)), raw=True)
    assert 2 * SHARED_CHUNK < len(ids) <= 512  # alone: one forward
    want = []
    for chunk in pipe.stream_ids(ids, session=pipe.new_session(), max_new_tokens=8):
        want += chunk.token_ids
    rows: list[int] = []
    real = FusedPass.run_many

    def counted(self, model, parts, taps):
        rows.append(sum(len(tokens) for tokens, _, _ in parts))
        return real(self, model, parts, taps)

    streams = Streams(pipe, parallel=2)
    assert streams.chunk == SHARED_CHUNK
    stream = streams.open(ids, max_new_tokens=8)
    other = streams.open(pipe.encode("Hello", raw=True), max_new_tokens=4)
    got: dict[int, list[int]] = {id(stream): [], id(other): []}
    monkeypatch.setattr(FusedPass, "run_many", counted)
    while streams.active:
        for s, chunk in streams.step():
            assert not isinstance(chunk, Exception), chunk
            got[id(s)] += chunk.token_ids
    assert got[id(stream)] == want and len(got[id(other)]) == 4
    assert max(rows) <= SHARED_CHUNK + 1  # a chunk and the other answer's decode row
