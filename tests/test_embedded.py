"""End to end on the embedded default (SmolLM2-135M-Instruct, Q4_1 GGUF), fp32, offline.

The reference is transformers itself: its GGUF reader, its model class and `generate`,
fed the same chat-templated prompt. Our greedy tokens must be identical.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from specgen.api.pipeline import Pipeline
from specgen.text.codec import Detokenizer
from support.embedded import spec_bench_questions

pytestmark = pytest.mark.slow

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def pipe(embedded_dir):
    os.environ.setdefault("SPECGEN_HOME", str(embedded_dir.parents[1]))
    return Pipeline.load("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def fp32_pipe(embedded_dir):
    """The file's model itself: fp32 activations. The default rounds them to 8 bits per
    block as llama.cpp does (another function of the file; every method is held to AR under
    it). A pipeline of its own, run only under SPECGEN_CPU_ACT=fp32: a session's reused
    prompt cache holds the rows it computed."""
    os.environ.setdefault("SPECGEN_HOME", str(embedded_dir.parents[1]))
    return Pipeline.load("smollm2-135m", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def reference(embedded_gguf):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, file = str(embedded_gguf.parent), embedded_gguf.name
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder, gguf_file=file)


def test_the_alias_resolves_to_the_embedded_gguf(pipe):
    assert pipe.name == "smollm2-135m" and pipe.model.args.num_layers == 30


@pytest.mark.parametrize("question", spec_bench_questions({111, 121, 321}))
def test_greedy_tokens_identical_to_transformers_generate(
    fp32_pipe, reference, question, monkeypatch
):
    monkeypatch.setenv("SPECGEN_CPU_ACT", "fp32")  # read per product
    pipe = fp32_pipe
    model, tokenizer = reference
    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
    ids = list(prompt["input_ids"])
    assert pipe.encode(question) == ids  # same template, same tokenizer
    out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = out[0, len(ids) :].tolist()
    got = pipe.generate(question, max_new_tokens=NEW_TOKENS)
    stop = [2] if got.stats.finish_reason == "stop" else []  # we do not emit the stop token
    assert got.token_ids + stop == expected


def test_detokenizer_on_the_real_tokenizer(pipe):
    text = "Grüße aus Zürich — 東京タワー 🙂🚀 ok"
    ids = pipe.codec.encode_raw(text)
    detok = Detokenizer(pipe.codec)
    pieces = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)


def _cli(args, stdin=None):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "specgen", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_cli_generate_on_the_default_model(pipe):
    # the default's 8-bit activations answer as llama.cpp does on this file (with fp32 ones
    # it said "Paris" here, llama.cpp a list of Parisian places); this one all three share
    result = _cli(["generate", "Why is the sky blue?", "-n", "24"])
    assert result.returncode == 0, result.stderr
    assert "The sky appears blue because of a phenomenon" in result.stdout
    # the command line answers what the library answers
    assert result.stdout.strip() == pipe.generate("Why is the sky blue?", max_new_tokens=24).text


def test_cli_json_from_a_pipe_on_the_default_model(pipe):
    result = _cli(["generate", "--json", "-n", "8"], stdin="Name a primary colour.\n")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["prompt"] == "Name a primary colour." and record["stats"]["new_tokens"] > 0


# --- ngram on the default model -------------------------------------------------------------

REPEATS = [  # a second identical question: prompt lookup drafts the earlier answer + EOS
    [
        {"role": "user", "content": "Reply with exactly one word: OK"},
        {"role": "assistant", "content": "OK"},
        {"role": "user", "content": "Reply with exactly one word: OK"},
    ],
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."},
        {"role": "user", "content": "What is the capital of France?"},
    ],
]


def _steps(pipe, prompt, max_new_tokens):
    """(tokens, [(accepted in step, finish)]) from a fresh session."""
    tokens, steps, before = [], [], 0
    ids = pipe.encode(prompt)
    for chunk in pipe.stream_ids(ids, max_new_tokens=max_new_tokens, session=pipe.new_session()):
        tokens.extend(chunk.token_ids)
        steps.append((chunk.stats.accepted - before, chunk.stats.finish_reason))
        before = chunk.stats.accepted
    return tokens, steps


def test_ngram_is_token_identical_to_ar_on_the_default_model(pipe):
    from specgen.api.spec import load_method
    from specgen.core.config import SpecConfig

    # whole drafts verified (no scheduler): the most acceptance paths exercised
    spec = SpecConfig(method="ngram")
    method = load_method(pipe.model, spec, pipe.name)
    ngram = Pipeline(pipe.model, pipe.codec, pipe.name, pipe.context, spec, method=method)
    prompts = spec_bench_questions(set(range(0, 1000))) + REPEATS
    assert len(prompts) >= 10
    endings = set()
    for prompt in prompts:
        want, _ = _steps(pipe, prompt, NEW_TOKENS)
        got, steps = _steps(ngram, prompt, NEW_TOKENS)
        assert got == want
        accepted, finish = steps[-1]
        if accepted:
            endings.add(finish)
    # EOS and max_new_tokens both fell inside an accepted run at least once
    assert {"stop", "length"} <= endings


def test_dflash_with_an_untrained_drafter_is_still_exact(pipe, tmp_path):
    """A random z-lab-format drafter for the default model: almost nothing is accepted,
    and the output must still be token-for-token the AR output."""
    from specgen.core.config import SpecConfig
    from support.drafters import save_tiny_dflash

    path = save_tiny_dflash(
        tmp_path / "dflash",
        hidden=576,
        heads=9,
        kv_heads=3,
        head_dim=64,
        vocab=49152,
        layers=1,
        block_size=8,
        mask_token_id=0,
        num_target_layers=30,
        scale=0.05,
    )
    spec = SpecConfig(method="dflash", drafter=str(path), verify_policy="full")
    dflash = pipe.with_spec(spec)
    assert dflash.method.net.args.target_layer_ids == (15,)  # derived: one layer -> the middle
    for question in spec_bench_questions({81, 121, 321}):
        want = pipe.generate(question, max_new_tokens=24, session=pipe.new_session())
        got = dflash.generate(question, max_new_tokens=24, session=dflash.new_session())
        assert got.token_ids == want.token_ids
        assert got.stats.verified > 0


@pytest.mark.parametrize("policy", ["full", "threshold=0.3"])
def test_dspark_with_an_untrained_drafter_is_still_exact(pipe, tmp_path, policy):
    """A random DeepSpec-format drafter (Markov + confidence heads) for the default model."""
    from specgen.core.config import SpecConfig
    from support.drafters import save_tiny_dspark

    path = save_tiny_dspark(
        tmp_path / "dspark",
        hidden=576,
        heads=9,
        kv_heads=3,
        head_dim=64,
        vocab=49152,
        layers=1,
        rank=16,
        target_layer_ids=[2, 15, 27],
        num_target_layers=30,
        scale=0.05,
    )
    spec = SpecConfig(method="dspark", drafter=str(path), verify_policy=policy)
    dspark = pipe.with_spec(spec)
    for question in spec_bench_questions({81, 121, 321}):
        want = pipe.generate(question, max_new_tokens=24, session=pipe.new_session())
        got = dspark.generate(question, max_new_tokens=24, session=dspark.new_session())
        assert got.token_ids == want.token_ids
        assert got.stats.mean_confidence is not None
        if policy == "full":
            assert got.stats.verified > 0


@pytest.mark.parametrize("method", ["dflash", "dspark", "stacked"])
def test_shipped_drafters_are_exact_and_accept_drafts(pipe, method):
    """The drafters specgen trained for the default model ship in the package: they load
    from the registry with no --drafter, offline, and decode token for token like AR."""
    from specgen.core.config import SpecConfig

    spec = SpecConfig(method=method, verify_policy="full")
    spec_pipe = pipe.with_spec(spec)
    accepted = 0
    for question in spec_bench_questions({81, 121, 321}):
        want = pipe.generate(question, max_new_tokens=48, session=pipe.new_session())
        got = spec_pipe.generate(question, max_new_tokens=48, session=spec_pipe.new_session())
        assert got.token_ids == want.token_ids
        accepted += got.stats.accepted
    assert accepted > 0


def test_shipped_drafters_are_small_and_in_their_public_layouts():
    from specgen.hub import resolve_drafter
    from specgen.registry import MODELS

    drafters = MODELS["smollm2-135m"].drafters
    for method, kind in (("dflash", "DFlashDraftModel"), ("dspark", "Qwen3DSparkModel")):
        path = resolve_drafter(drafters[method])
        config = json.loads((path / "config.json").read_text())
        assert config["architectures"] == [kind]
        assert (path / "model.safetensors").stat().st_size < 40 * 2**20
        assert (path / "training.json").is_file() and (path / "draft_vocab.json").is_file()
    assert (resolve_drafter(drafters["dspark"]) / "calibration.json").is_file()


def test_cli_dspark_on_the_default_model_needs_no_drafter(pipe):
    env = {**os.environ, "NO_COLOR": "1"}
    args = [sys.executable, "-m", "specgen", "generate", "What is 12 * 7?", "--method",
            "dspark", "-n", "24", "--json", "--device", "cpu"]  # fmt: skip
    out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    record = json.loads(out.stdout)
    assert record["stats"]["steps"] > 0 and record["text"]
