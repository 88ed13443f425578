"""A Qwen3.5 target end to end: every method, the engines, chat sessions, Ctrl-C, sampling,
training a drafter for it, the bench, and bad input, through the public API and the CLI.

The DFlash drafter here is one `specgen train` wrote for the tiny hybrid target (z-lab's
`DFlashDraftModel` layout), trained briefly on the target's own answers: it drafts well on
some prompts and poorly on others, so verify steps accept anything from 0 to every draft.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from support.cli import assert_one_line_error
from support.drafters import save_tiny_dflash
from support.statistics import chi_square_pvalue
from support.targets import TINY_VOCAB

runner = CliRunner()
FAST = ["--device", "cpu", "--dtype", "float32"]
TRAINED_ON = [
    "The quick brown fox",
    "def add(a, b):",
    "Speculative decoding drafts tokens",
    "Café, naïve",
    "return a + b",
    "the lazy dog",
    "verifies them with the target",
]
PROMPTS = [*TRAINED_ON[:3], "The lazy brown dog", "def sub(a, b):"]


@pytest.fixture(scope="module")
def ar(tiny_qwen3_5):
    return Pipeline.load(str(tiny_qwen3_5), device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def trained(tiny_qwen3_5, ar, tmp_path_factory):
    """`specgen train --kind dflash` for the hybrid target, 100 steps (~15 s here)."""
    out = tmp_path_factory.mktemp("q35-drafter")
    rows = []
    for text in TRAINED_ON:
        answer = ar.generate(text, raw=True, max_new_tokens=48, session=ar.new_session())
        rows.append({"prompt_ids": ar.encode(text, raw=True), "response_ids": answer.token_ids})
    data = out / "answers.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    result = runner.invoke(app, [
        "train", "--model", str(tiny_qwen3_5), "--kind", "dflash", "--data", str(data),
        "--out", str(out / "d"), "--steps", "100", "--target-layers", "1,3", "--block-size",
        "6", "--mask-token-id", str(TINY_VOCAB - 1), "--lr", "3e-3", "--device", "cpu",
    ])  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return out / "d"


@pytest.fixture(scope="module")
def dflash(ar, trained):
    return ar.with_spec(SpecConfig(method="dflash", drafter=str(trained), verify_policy="full",
                                   trace=True))  # fmt: skip


def test_the_trained_drafter_is_a_zlab_drafter_for_the_hybrid_target(trained):
    config = json.loads((trained / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert config["num_target_layers"] == 6 and config["dflash_config"]["target_layer_ids"] == [
        1,
        3,
    ]
    assert "text_config" not in config and "linear_num_value_heads" not in config
    assert "partial_rotary_factor" not in config["rope_parameters"]  # drafters rotate whole heads


def test_dflash_is_plain_decoding_with_drafts_partly_accepted(ar, dflash):
    accepted = []
    for prompt in PROMPTS:
        want = ar.generate(prompt, raw=True, max_new_tokens=40, session=ar.new_session())
        got = dflash.generate(prompt, raw=True, max_new_tokens=40, session=dflash.new_session())
        assert got.token_ids == want.token_ids, prompt
        accepted += [(r["accepted"], r["verify_length"]) for r in got.stats.trace[1:]]
    assert any(0 < a < n for a, n in accepted)  # partly accepted
    assert any(a == n > 0 for a, n in accepted) and any(a == 0 < n for a, n in accepted)


@pytest.mark.parametrize("engine", ["sync", "overlap"])
def test_the_cost_policy_ngram_and_both_engines(ar, trained, engine):
    prompt = PROMPTS[1]
    want = ar.generate(prompt, raw=True, max_new_tokens=30, session=ar.new_session()).token_ids
    for spec in (
        SpecConfig(method="dflash", drafter=str(trained), engine=engine),  # the cost scheduler
        SpecConfig(method="ngram", engine=engine, verify_policy="full"),
    ):
        pipe = ar.with_spec(spec)
        got = pipe.generate(prompt, raw=True, max_new_tokens=30, session=pipe.new_session())
        assert got.token_ids == want, spec


@pytest.mark.statistical
def test_sampling_keeps_the_targets_distribution(ar, dflash):
    """The second token's empirical distribution converges to the exact one (T = 1)."""
    from specgen.verify.sampling import probabilities

    model, params = ar.model, SamplingParams(temperature=1.0, top_k=4)
    prompt = ar.encode(PROMPTS[0], raw=True)
    first = probabilities(model(torch.tensor([prompt]), model.new_cache(32)).logits[0, -1], params)
    seconds = torch.tensor([prompt + [x] for x in range(TINY_VOCAB)])
    logits = model(seconds, model.new_cache(32, batch=TINY_VOCAB)).logits[:, -1]
    exact = first @ probabilities(logits, params)  # P(x2) = sum_x1 p(x1) p(x2 | x1)
    counts, n = torch.zeros(TINY_VOCAB), 1200
    session = dflash.new_session()
    for seed in range(n):
        sampling = SamplingParams(temperature=1.0, top_k=4, seed=seed)
        out = dflash.generate(PROMPTS[0], raw=True, sampling=sampling, max_new_tokens=2,
                              session=session)  # fmt: skip
        counts[out.token_ids[1]] += 1
    tv = 0.5 * (counts / n - exact).abs().sum().item()
    far = 0.5 * (torch.distributions.Dirichlet(torch.ones(TINY_VOCAB)).sample() - exact).abs().sum()
    assert tv < 0.07 and tv < far / 5, (tv, far)
    assert chi_square_pvalue(counts, exact) > 1e-4  # seeded: the same draws on every run


def test_a_chat_reuses_its_prefix_exactly(ar, dflash):
    """Turn 2 extends turn 1 (the cache is reused); turn 3 re-renders the end of an earlier
    prompt differently (the state rolls back to a snapshot, then prefills the rest)."""
    for pipe in (ar, dflash):
        session = pipe.new_session()
        history = [{"role": "user", "content": "The quick brown fox"}]
        first = pipe.generate(history, max_new_tokens=12, session=session)
        history += [{"role": "assistant", "content": first.text},
                    {"role": "user", "content": "def add(a, b):"}]  # fmt: skip
        second = pipe.generate(history, max_new_tokens=12, session=session)
        assert second.stats.prefill_tokens < second.stats.prompt_tokens  # reused
        fresh = pipe.generate(history, max_new_tokens=12, session=pipe.new_session())
        assert second.token_ids == fresh.token_ids
        # the same history with the first answer changed: diverges inside an earlier prompt
        edited = [history[0], {"role": "assistant", "content": "x"}, history[2]]
        third = pipe.generate(edited, max_new_tokens=12, session=session)
        fresh = pipe.generate(edited, max_new_tokens=12, session=pipe.new_session())
        assert third.token_ids == fresh.token_ids
        assert third.stats.prefill_tokens < third.stats.prompt_tokens  # from a snapshot


def test_an_answer_stopped_mid_stream_leaves_an_exact_session(ar, dflash):
    """Ctrl-C in chat closes the stream mid-answer; the next turn is what a fresh session
    would answer after the same (partial) history."""
    for pipe in (ar, dflash):
        session = pipe.new_session()
        stream = pipe.stream("The quick brown fox", max_new_tokens=30, session=session)
        partial = [token for _, chunk in zip(range(5), stream, strict=False)
                   for token in chunk.token_ids]  # fmt: skip
        stream.close()
        assert partial
        history = [{"role": "user", "content": "The quick brown fox"},
                   {"role": "assistant", "content": pipe.codec.decode(partial)},
                   {"role": "user", "content": "def add(a, b):"}]  # fmt: skip
        got = pipe.generate(history, max_new_tokens=12, session=session)
        want = pipe.generate(history, max_new_tokens=12, session=pipe.new_session())
        assert got.token_ids == want.token_ids


# --- the CLI -----------------------------------------------------------------------------


def test_cli_ar_is_transformers_greedy_generate(tiny_qwen3_5):
    from transformers import AutoModelForImageTextToText

    from specgen.text.codec import TextCodec

    prompt = "The quick brown fox"
    args = ["generate", prompt, "--raw", "--json", "--model", str(tiny_qwen3_5), "-n", "24"]
    result = runner.invoke(app, [*args, *FAST, "--method", "ar"])
    assert result.exit_code == 0, result.stderr
    ids = torch.tensor([TextCodec(tiny_qwen3_5, "tiny", (2,)).encode_raw(prompt)])
    hf = AutoModelForImageTextToText.from_pretrained(tiny_qwen3_5, dtype=torch.float32).eval()
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :].tolist()
    stop = want.index(2) if 2 in want else len(want)  # specgen does not emit the stop token
    assert json.loads(result.stdout)["token_ids"] == want[:stop]


def test_cli_dflash_trace_and_bench_on_a_hybrid_target(tiny_qwen3_5, trained, tmp_path):
    base = ["generate", PROMPTS[0], "--raw", "--json", "--model", str(tiny_qwen3_5), *FAST,
            "-n", "16"]  # fmt: skip
    ar_ids = json.loads(runner.invoke(app, base).stdout)["token_ids"]
    result = runner.invoke(app, [*base, "--drafter", str(trained), "--trace"])
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["token_ids"] == ar_ids and record["trace"]
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"category": "c", "turns": [t]}) + "\n"
                             for t in PROMPTS[:2]))  # fmt: skip
    bench = runner.invoke(app, ["bench", "--model", str(tiny_qwen3_5), "--suite", str(suite),
                                "--methods", "dflash,hf", "--drafter", str(trained),
                                "--max-new-tokens", "12", *FAST, "--json"])  # fmt: skip
    assert bench.exit_code == 0, bench.stderr
    last = json.loads(bench.stdout.strip().splitlines()[-1])
    assert last["lossless"]["dflash"]["match_rate"] == 1.0
    assert last["lossless"]["hf"]["match_rate"] == 1.0  # transformers' own Qwen3.5


def test_a_qwen3_drafter_on_a_qwen3_5_target_names_both(tiny_qwen3_5, tmp_path):
    drafter = save_tiny_dflash(tmp_path / "qwen3-drafter", vocab=TINY_VOCAB + 16,
                               target_layer_ids=[1, 3])  # fmt: skip
    result = runner.invoke(app, ["generate", "hi", "--model", str(tiny_qwen3_5), *FAST,
                                 "--drafter", str(drafter)])  # fmt: skip
    assert_one_line_error(result, 2, "does not fit target", "vocabulary 336 vs 320")


def test_a_checkpoint_missing_a_gated_deltanet_tensor(tiny_qwen3_5, tmp_path):
    path = shutil.copytree(tiny_qwen3_5, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors.pop("model.language_model.layers.2.linear_attn.dt_bias")
    save_file(tensors, path / "model.safetensors")
    result = runner.invoke(app, ["generate", "hi", "--model", str(path), *FAST])
    assert_one_line_error(result, 2, "lacks model.language_model.layers.2.linear_attn.dt_bias")


def test_an_moe_config_is_refused(tiny_qwen3_5, tmp_path):
    path = shutil.copytree(tiny_qwen3_5, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "qwen3_5_moe"
    (path / "config.json").write_text(json.dumps(cfg))
    result = runner.invoke(app, ["generate", "hi", "--model", str(path), *FAST])
    assert_one_line_error(result, 2, "mixture-of-experts targets are not supported")


def test_a_prompt_longer_than_the_context(tiny_qwen3_5):
    long = "The quick brown fox jumps over the lazy dog. " * 5
    result = runner.invoke(app, ["generate", long, "--model", str(tiny_qwen3_5), *FAST,
                                 "--context", "16"])  # fmt: skip
    assert_one_line_error(result, 2, "context limit is 16")


def test_thinking_follows_the_drafters_and_a_mismatch_is_said_once(
    tiny_qwen3_5, trained, tmp_path, monkeypatch
):
    """An alias whose drafters were trained with thinking on gets it by default; asking for
    the other mode works, with one note that acceptance will suffer."""
    from specgen.api import loader
    from specgen.hub import ResolvedModel
    from specgen.registry import MODELS, ModelEntry

    path = shutil.copytree(tiny_qwen3_5, tmp_path / "m")
    config = json.loads((path / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"
        "<|im_start|>{% if enable_thinking %}think{% endif %}"
    )
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    entry = ModelEntry("tiny-q35", "none/tiny", "test", {"dflash": str(trained)}, thinking=True)
    monkeypatch.setitem(MODELS, "tiny-q35", entry)
    local = ResolvedModel(path, "tiny-q35", "local")
    monkeypatch.setattr(loader, "resolve_model", lambda spec, notify=None: local)
    pipe = Pipeline.load("tiny-q35", device="cpu", dtype="float32")
    assert pipe.thinking is True
    assert pipe.encode("hi") == pipe.encode("hi", think=True) != pipe.encode("hi", think=False)
    args = ["generate", "hi", "--model", "tiny-q35", "--method", "dflash", *FAST, "-n", "4"]
    said = runner.invoke(app, [*args, "--no-think"])
    assert said.exit_code == 0, said.stderr
    assert said.stderr.count("trained with thinking on") == 1
    quiet = runner.invoke(app, args)  # the default: no mismatch, nothing said
    assert quiet.exit_code == 0 and "thinking" not in quiet.stderr
