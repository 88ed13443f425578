"""The CLI contract: output formats, and one clear line + non-zero exit for bad input."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from support.cli import FAST, assert_one_line_error, run

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

# --- what works -------------------------------------------------------------------------


def test_generate_streams_the_answer(tiny_llama):
    result = run("generate", "The quick brown fox", "--model", str(tiny_llama), *FAST)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.endswith("\n") and result.stdout.strip()


def test_cuda_graph_flag_is_accepted_and_changes_nothing_on_the_cpu(tiny_llama, monkeypatch):
    from specgen.cli.options import Run

    seen = []
    load = Run.load
    def recording(self, spec=None, **kw):
        seen.append(spec)
        return load(self, spec, **kw)

    monkeypatch.setattr(Run, "load", recording)
    outputs = []
    for flag in ("--cuda-graphs", "--no-cuda-graphs"):
        args = ("generate", "The quick brown fox", "--model", str(tiny_llama), "--json", flag)
        result = run(*args, *FAST)
        assert result.exit_code == 0, result.stderr
        outputs.append(json.loads(result.stdout)["token_ids"])
    assert [spec.cuda_graphs for spec in seen] == [True, False]
    assert outputs[0] == outputs[1]


def test_generate_json_from_stdin(tiny_llama):
    result = run("generate", "--json", "--model", str(tiny_llama), *FAST, input="Hello there\n")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["prompt"] == "Hello there"
    assert set(record) == {"prompt", "text", "token_ids", "stats"}
    for key in (
        "new_tokens",
        "seconds",
        "tokens_per_second",
        "steps",
        "acceptance_length",
        "accepted_per_position",
    ):
        assert key in record["stats"]
    assert record["stats"]["new_tokens"] == len(record["token_ids"])


def test_prompt_file_jsonl_keeps_input_order(tiny_llama, tmp_path):
    prompts = tmp_path / "p.jsonl"
    rows = [{"prompt": "first"}, {"turns": ["second", "a reply to it"]}, {"prompt": "third"}]
    prompts.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    result = run("generate", "-f", str(prompts), "--json", "--model", str(tiny_llama), *FAST)
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    # a line with turns is one conversation: a record per turn, numbered
    assert [r["prompt"] for r in records] == ["first", "second", "a reply to it", "third"]
    assert [r.get("turn") for r in records][1:3] == [1, 2]


def test_prompt_file_txt_and_stdin_lines(tiny_llama, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\n\ntwo\n")
    result = run("generate", "-f", str(prompts), "--json", "--model", str(tiny_llama), *FAST)
    assert [json.loads(x)["prompt"] for x in result.stdout.splitlines()] == ["one", "two"]
    result = run("generate", "-f", "-", "--json", "--model", str(tiny_llama), *FAST, input="a\nb\n")
    assert [json.loads(x)["prompt"] for x in result.stdout.splitlines()] == ["a", "b"]


def test_chat_keeps_history_and_handles_commands(tiny_llama):
    script = "hello\n/stats\n/bogus\n/reset\nhi again\n/exit\nnever read\n"
    result = run("chat", "--model", str(tiny_llama), *FAST, input=script)
    assert result.exit_code == 0, result.stderr
    assert "1 answer ·" in result.stderr and "conversation forgotten" in result.stderr
    assert "unknown command /bogus" in result.stderr


def test_chat_survives_a_history_longer_than_the_context(tiny_llama):
    # a turn too long for any conversation fails alone (said once); the session goes on
    # with --on-full reset, and the exit status says a turn failed (issue 27)
    script = "a fairly long first message for a tiny context\n/reset\nhi\n"
    args = ["chat", "--model", str(tiny_llama), *FAST, "--context", "32", "--on-full", "reset"]
    result = run(*args, input=script)
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "context limit" in errors[0]
    assert "conversation forgotten" in result.stderr and result.stdout.strip()  # "hi" answered


def test_models_lists_every_alias():
    result = run("models", "--json")
    assert result.exit_code == 0
    rows = {row["alias"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert list(rows)[0] == "smollm2-135m" and rows["smollm2-135m"]["default"] is True
    assert not rows["qwen3-8b"]["default"] and rows["qwen3-8b"]["thinking"] is False
    assert rows["qwen3.5-9b"]["thinking"] is True  # z-lab's Qwen3.5 drafters think
    assert {"method": "dflash", "repo": "z-lab/Qwen3.5-9B-DFlash"} in rows["qwen3.5-9b"]["drafters"]
    assert rows["llama3.1-8b"]["repo"] == "meta-llama/Llama-3.1-8B-Instruct"
    table = run("models")
    assert "qwen3.5-27b" in table.stdout and "thinking" in table.stdout


# --- bad input: one line, non-zero exit, nothing lost -------------------------------------


def test_unknown_alias():
    assert_one_line_error(run("generate", "hi", "--model", "gpt-9"), 2, "unknown model 'gpt-9'")


def test_path_that_is_not_a_model(tmp_path):
    (tmp_path / "readme.txt").write_text("x")
    assert_one_line_error(run("generate", "hi", "--model", str(tmp_path)), 2, "not a model")


def test_unsupported_architecture(tiny_llama, tmp_path):
    path = shutil.copytree(tiny_llama, tmp_path / "m")
    cfg = json.loads((path / "config.json").read_text())
    cfg["model_type"] = "gpt_neox"
    (path / "config.json").write_text(json.dumps(cfg))
    result = run("generate", "hi", "--model", str(path), *FAST)
    assert_one_line_error(result, 2, "unsupported architecture 'gpt_neox'")


def test_missing_and_misshaped_tensors(tiny_llama, tmp_path):
    path = shutil.copytree(tiny_llama, tmp_path / "m")
    tensors = load_file(path / "model.safetensors")
    tensors.pop("model.norm.weight")
    save_file(tensors, path / "model.safetensors")
    result = run("generate", "hi", "--model", str(path), *FAST)
    assert_one_line_error(result, 2, "lacks model.norm.weight")


def test_corrupt_checkpoint(tiny_llama, tmp_path):
    path = shutil.copytree(tiny_llama, tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"\x00" * 100)
    assert_one_line_error(run("generate", "hi", "--model", str(path), *FAST), 2, "corrupt")


def test_corrupt_gguf(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    assert_one_line_error(run("generate", "hi", "--model", str(bad)), 2, "not a readable GGUF")


def test_empty_stdin(tiny_llama):
    result = run("generate", "--model", str(tiny_llama), *FAST, input="  \n")
    assert_one_line_error(result, 2, "stdin is empty")


def test_non_utf8_stdin(tiny_llama):
    result = run("generate", "--model", str(tiny_llama), *FAST, input=b"caf\xe9\n")
    assert_one_line_error(result, 2, "not valid UTF-8")


def test_prompt_file_with_invalid_utf8_reports_the_line(tiny_llama, tmp_path):
    # the good lines are answered, the bad one reported in its place (issue 27)
    prompts = tmp_path / "p.txt"
    prompts.write_bytes(b"fine\nalso fine\nbad \xff\xfe byte\n")
    result = run("generate", "-f", str(prompts), "--json", "--model", str(tiny_llama), *FAST)
    assert_one_line_error(result, 2, "line 3 is not valid UTF-8")
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == ["fine", "also fine", None]
    assert records[2]["line"] == 3 and "not valid UTF-8" in records[2]["error"]


def test_prompt_file_missing_or_malformed(tmp_path):
    # nothing to answer: one line at once, before any model is loaded
    assert_one_line_error(
        run("generate", "-f", str(tmp_path / "nope.txt")), 2, "no such prompt file"
    )
    bad = tmp_path / "p.jsonl"
    bad.write_text('{broken\n\n["a list"]\n')
    result = run("generate", "-f", str(bad), "--model", "gpt-9")  # the model is never read
    assert_one_line_error(result, 2, "no usable prompt in it (line 1 is not valid JSON")


def test_prompt_longer_than_the_context(tiny_llama):
    long = "The quick brown fox jumps over the lazy dog. " * 5
    result = run("generate", long, "--model", str(tiny_llama), *FAST, "--context", "16")
    assert_one_line_error(result, 2, "context limit is 16")


def test_one_bad_prompt_in_a_file_does_not_lose_the_others(tiny_llama, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("short\n" + "a much longer prompt that cannot fit " * 4 + "\nalso short\n")
    args = ["generate", "-f", str(prompts), "--json", "--model", str(tiny_llama), *FAST]
    result = run(*args, "--context", "40")
    assert result.exit_code == 2
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert "error" in records[1] and "text" in records[0] and "text" in records[2]
    assert records[1]["line"] == 2 and f"{prompts}: line 2: prompt is" in records[1]["error"]


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_new_tokens_must_be_positive(value):
    result = run("generate", "hi", "--max-new-tokens", value)
    assert_one_line_error(result, 2, "--max-new-tokens must be at least 1")


def test_bad_sampling_option_fails_before_loading():
    assert_one_line_error(run("generate", "hi", "--top-p", "0"), 2, "--top-p")


def test_debug_shows_the_real_exception():
    result = run("generate", "hi", "--model", "gpt-9", "--debug")
    assert result.exit_code != 0 and type(result.exception).__name__ == "ModelNotFoundError"


def test_pull_unknown_alias_and_offline(monkeypatch):
    assert_one_line_error(run("pull", "gpt-9"), 2, "unknown model")
    result = run("pull", "qwen3-4b", "--no-drafters")  # HF_HUB_OFFLINE=1 in tests
    assert result.exit_code == 2 and "HF_HUB_OFFLINE" in result.stderr.splitlines()[-1]
    # what to do, not "run specgen pull" again: the command being run is that one
    assert "unset HF_HUB_OFFLINE" in result.stderr and "specgen pull" not in result.stderr


# --- Ctrl-C mid-answer -------------------------------------------------------------------


def _interrupt_after(monkeypatch, chunks_before_interrupt):
    """Make the next stream raise KeyboardInterrupt (as Ctrl-C does) after some chunks."""
    from specgen.api.pipeline import Pipeline

    real = Pipeline.stream_ids
    state = {"armed": True}

    def stream_ids(self, *args, **kwargs):
        stream = real(self, *args, **kwargs)
        for i, chunk in enumerate(stream):
            if state["armed"] and i == chunks_before_interrupt:
                state["armed"] = False
                stream.close()  # the real generator unwinds as it would on a signal
                raise KeyboardInterrupt
            yield chunk

    monkeypatch.setattr(Pipeline, "stream_ids", stream_ids)


def test_ctrl_c_in_generate_keeps_the_partial_answer(tiny_llama, monkeypatch):
    _interrupt_after(monkeypatch, 3)
    result = run("generate", "The quick brown fox", "--json", "--model", str(tiny_llama), *FAST)
    assert result.exit_code == 130
    record = json.loads(result.stdout)
    assert record["stats"]["finish_reason"] == "interrupted" and len(record["token_ids"]) == 3
    assert result.stderr.strip() == "error: interrupted"


def test_ctrl_c_in_chat_stops_the_answer_not_the_session(tiny_llama, monkeypatch):
    _interrupt_after(monkeypatch, 2)
    result = run("chat", "--model", str(tiny_llama), *FAST, input="first\nsecond\n/stats\n")
    assert result.exit_code == 0, result.stderr
    assert "[answer stopped]" in result.stderr
    assert "2 answers" in result.stderr  # the stopped answer counts and the session went on


# --- speculative methods -------------------------------------------------------------------


def test_generate_with_ngram_reports_acceptance(tiny_llama):
    prompt = "The quick brown fox jumps over the lazy dog. The quick brown fox"
    args = ["generate", prompt, "--raw", "--json", "--model", str(tiny_llama)]
    ar = json.loads(run(*args, *FAST, "-n", "24").stdout)
    result = run(*args, *FAST, "-n", "24", "--method", "ngram", "-k", "5")
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["token_ids"] == ar["token_ids"]  # lossless
    stats = record["stats"]
    assert stats["acceptance_length"] >= 1.0
    assert stats["steps"] <= stats["new_tokens"] + 1
    assert len(stats["accepted_per_position"]) <= 5
    assert all(0.0 <= rate <= 1.0 for rate in stats["accepted_per_position"])


def test_unknown_method_and_bad_draft_length():
    result = run("generate", "hi", "--method", "medusa")
    assert result.exit_code == 2 and "medusa" in result.stderr
    assert_one_line_error(
        run("generate", "hi", "--method", "ngram", "-k", "0"), 2, "--draft-tokens"
    )


def test_dflash_through_the_cli_with_trace(tiny_qwen3_deep, tiny_dflash):
    prompt = "The quick brown fox"
    base = ["generate", prompt, "--json", "--model", str(tiny_qwen3_deep), *FAST, "-n", "16"]
    ar = json.loads(run(*base).stdout)
    result = run(*base, "--drafter", str(tiny_dflash), "--trace")  # kind read from config
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["token_ids"] == ar["token_ids"]
    trace = record["trace"]
    assert trace and {"drafter", "draft", "verify_length", "accepted", "bonus"} <= set(trace[0])
    assert all(step["drafter"] == "dflash" for step in trace)


def test_dflash_without_a_known_drafter(tiny_qwen3_deep, tmp_path):
    result = run("generate", "hi", "--model", str(tiny_qwen3_deep), "--method", "dflash")
    assert_one_line_error(result, 2, "no dflash drafter")
    (tmp_path / "notes.txt").write_text("x")
    result = run("generate", "hi", "--drafter", str(tmp_path))
    assert_one_line_error(result, 2, "not a drafter checkpoint")


def test_dspark_through_the_cli_shows_the_schedulers_decisions(tiny_qwen3_deep, tiny_dspark):
    prompt = "The quick brown fox"
    base = ["generate", prompt, "--json", "--model", str(tiny_qwen3_deep), *FAST, "-n", "16"]
    ar = json.loads(run(*base).stdout)
    for policy in ("cost", "full", "threshold=0.2"):
        result = run(*base, "--method", "dspark", "--drafter", str(tiny_dspark), "--trace",
                     "--verify-policy", policy)  # fmt: skip
        assert result.exit_code == 0, result.stderr
        record = json.loads(result.stdout)
        assert record["token_ids"] == ar["token_ids"]
        stats = record["stats"]
        assert stats["verify_policy"] == policy and stats["mean_confidence"] is not None
        assert all("confidence" in step for step in record["trace"][1:] if step["draft"])


def test_bad_verify_policy_is_one_line():
    result = run("generate", "hi", "--method", "ngram", "--verify-policy", "sometimes")
    assert_one_line_error(result, 2, "--verify-policy must be cost, full or threshold=X")


def test_calibrate_writes_beside_the_drafter_and_is_used(tiny_qwen3_deep, tiny_dspark, tmp_path):
    drafter = tmp_path / "drafter"
    shutil.copytree(tiny_dspark, drafter)
    prompts = tmp_path / "p.txt"
    prompts.write_text("The quick brown fox\ndef add(a, b):\nOnce upon a time\n")
    model = ["--model", str(tiny_qwen3_deep), "--device", "cpu", "--dtype", "float32"]
    result = run("calibrate", "--prompts", str(prompts), "--drafter", str(drafter), *model,
                 "-n", "24", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["path"] == str(drafter / "calibration.json")
    assert len(record["temperatures"]) == 7 and record["drafts"] > 10
    assert len(record["ece_before"]) == len(record["ece_after"]) == 7
    # the fitted temperatures change the confidences generation reports, not the tokens
    gen = ["generate", "Once upon a time", "--json", *model, "-n", "12", "--drafter"]
    plain = json.loads(run(*gen, str(tiny_dspark), "--verify-policy", "full").stdout)
    fitted = json.loads(run(*gen, str(drafter), "--verify-policy", "full").stdout)
    assert fitted["token_ids"] == plain["token_ids"]
    assert fitted["stats"]["mean_confidence"] != plain["stats"]["mean_confidence"]


def test_calibrate_refuses_a_drafter_without_confidence_head(tiny_qwen3_deep, tmp_path):
    from support.drafters import save_tiny_dspark

    drafter = save_tiny_dspark(tmp_path / "plain", rank=0, confidence=False)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hello\n")
    result = run("calibrate", "--prompts", str(prompts), "--drafter", str(drafter),
                 "--model", str(tiny_qwen3_deep), "--device", "cpu")  # fmt: skip
    assert_one_line_error(result, 2, "has no confidence head to calibrate")


def test_train_bad_input_is_one_line(tmp_path):
    out = str(tmp_path / "d")
    assert_one_line_error(
        run("train", "--kind", "eagle", "--data", "x", "--out", out, "--steps", "1"),
        2, "--kind must be dflash, dspark or eagle3",
    )  # fmt: skip
    assert_one_line_error(
        run("train", "--kind", "dflash", "--data", "x", "--out", out), 2, "give a budget"
    )
    assert_one_line_error(
        run("train", "--kind", "dflash", "--data", str(tmp_path / "none.jsonl"), "--out", out,
            "--steps", "1"),
        2, "no such data file",
    )  # fmt: skip


def test_train_writes_a_drafter_generate_can_use(tiny_qwen3_deep, tmp_path):
    data = tmp_path / "r.jsonl"
    data.write_text(json.dumps({"prompt_ids": [5, 6, 7, 8], "response_ids": list(range(20, 60))}))
    out = tmp_path / "d"
    result = run("train", "--model", str(tiny_qwen3_deep), "--kind", "dflash", "--data",
                 str(data), "--out", str(out), "--steps", "2", "--target-layers", "1,3",
                 "--block-size", "4", "--mask-token-id", "319", "--device", "cpu")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    gen = run("generate", "hi", "--model", str(tiny_qwen3_deep), *FAST, "--drafter", str(out),
              "--json")  # fmt: skip
    assert gen.exit_code == 0, gen.stderr
    assert json.loads(gen.stdout)["stats"]["verify_policy"] == "cost"


def test_train_answers_prompts_then_trains_and_resumes_the_answers(tiny_qwen3_deep, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"turns": [t]}) for t in ("hello there", "a b c")))
    out = tmp_path / "d"
    common = ("--model", str(tiny_qwen3_deep), "--prompts", str(prompts), "--out", str(out),
              "--max-new-tokens", "12", "--device", "cpu")  # fmt: skip
    only = run("train", *common)  # no budget: answers only
    assert only.exit_code == 0, only.stderr
    answers = (out / "answers.jsonl").read_text().splitlines()
    assert len(answers) == 2 and not (out / "config.json").exists()
    result = run("train", *common, "--kind", "dspark", "--steps", "2", "--target-layers", "1,3",
                 "--block-size", "4", "--mask-token-id", "319", "--markov-rank", "8")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert (out / "answers.jsonl").read_text().splitlines() == answers  # not answered twice
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Qwen3DSparkModel"]
    assert_one_line_error(run("train", "--out", str(out), "--steps", "1"), 2, "give --prompts")
