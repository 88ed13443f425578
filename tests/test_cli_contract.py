"""The CLI contract, continued (issue 27's minor points): --version, help texts, options that
contradict each other, prompt files with bad lines, and scripted chat sessions."""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from specgen.cli import app
from specgen.core.stats import GenStats

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

runner = CliRunner()
FAST = ["--device", "cpu", "--dtype", "float32", "--max-new-tokens", "6"]


def run(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def errors(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error:")]


def assert_one_line_error(result, code, *fragments):
    assert result.exit_code == code, (result.exit_code, result.stdout, result.stderr)
    assert len(errors(result)) == 1 and result.stderr.strip().splitlines()[-1] == errors(result)[0]
    for fragment in fragments:
        assert fragment in errors(result)[0], errors(result)[0]
    assert "Traceback" not in result.stderr


# --- --version and help ------------------------------------------------------------------


def test_version_prints_the_package_version():
    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"specgen {version('specgen')}\n"


def test_every_option_of_every_command_has_help():
    root = get_command(app)
    commands = {"specgen": root, **root.commands}
    for name, command in commands.items():
        for param in command.params:
            if param.param_type_name == "option":
                assert (param.help or "").strip(), f"specgen {name} {param.opts[0]} has no help"


def _help(command: str, option: str) -> str:
    params = get_command(app).commands[command].params
    return next(p.help for p in params if option in p.opts)


def test_help_says_what_each_command_does_with_the_shared_options():
    assert "answer" in _help("generate", "--quiet")
    for command in ("bench", "calibrate"):  # they print a table, not an answer
        assert "table" in _help(command, "--quiet") and "answer" not in _help(command, "--quiet")
    text = run("calibrate", "--help").stdout
    assert "calibration.json" in text and "DSpark" in text
    for wrong in ("--method", "stacked", "object per prompt"):  # calibrate takes none of these
        assert wrong not in text, wrong
    assert "sync on the CPU" in _help("generate", "--engine")  # auto: no CPU thread
    assert "mean of the last 20" in " ".join(run("train", "--help").stdout.split())


def test_shared_options_default_to_the_librarys_and_are_picked_by_group():
    from specgen.cli.options import DEFAULTS, GROUPS, run_options
    from specgen.core.config import DEFAULT_MAX_NEW_TOKENS, SamplingParams, SpecConfig
    from specgen.serve.openai_api import Defaults

    sampling, spec = SamplingParams(), SpecConfig()
    assert [DEFAULTS[n] for n in GROUPS["sampling"]] == [
        DEFAULT_MAX_NEW_TOKENS, sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed,
        sampling.presence_penalty, sampling.frequency_penalty, sampling.repetition_penalty,
    ]  # fmt: skip
    assert Defaults().max_tokens == DEFAULT_MAX_NEW_TOKENS
    penalties = ("presence_penalty", "frequency_penalty", "repetition_penalty")
    assert [getattr(Defaults(), n) for n in penalties] == [getattr(sampling, n) for n in penalties]
    assert [DEFAULTS[n] for n in GROUPS["engine"]] == [
        str(spec.verify_policy),
        spec.engine,
        spec.cuda_graphs,
    ]
    for bad in (dict(picks=("sampling", "top_p")), dict(picks=("colour",)),
                dict(picks=("sampling",), without=("quiet",))):  # fmt: skip
        with pytest.raises(ValueError):
            run_options(*bad["picks"], without=bad.get("without", ()))


# --- options that contradict each other: one line, before anything is loaded --------------


def test_method_ar_with_a_drafter_is_refused(tiny_dflash):
    for command in (["generate", "hi"], ["chat"]):
        result = run(*command, "--method", "ar", "--drafter", str(tiny_dflash), "-m", "gpt-9")
        assert_one_line_error(result, 2, "--method ar runs no drafter")


def test_a_drafter_of_another_kind_than_the_method_is_refused(
    tiny_qwen3_deep, tiny_dflash, tiny_dspark
):
    model = ["--model", str(tiny_qwen3_deep), *FAST]
    result = run("generate", "hi", *model, "--method", "dflash", "--drafter", str(tiny_dspark))
    assert_one_line_error(result, 2, "is a dspark drafter", "not a dflash one")
    prompts = tiny_qwen3_deep.parent / "calibrate-prompts.txt"
    prompts.write_text("hello\n")
    result = run("calibrate", "--prompts", str(prompts), "--drafter", str(tiny_dflash), *model)
    assert_one_line_error(result, 2, "is a dflash drafter", "not a dspark one")
    # without --method the drafter's own kind runs, as before
    result = run("generate", "hi", *model, "--drafter", str(tiny_dspark), "--json", "--trace")
    assert result.exit_code == 0, result.stderr
    assert {step["drafter"] for step in json.loads(result.stdout)["trace"]} == {"dspark"}


def test_trace_without_json_is_refused_before_loading():
    result = run("generate", "hi", "--trace", "--model", "gpt-9")
    assert_one_line_error(result, 2, "--trace adds a per-step record to the --json output")


def test_bench_refuses_a_drafter_for_a_method_it_does_not_run(tiny_dflash):
    args = ["bench", "--methods", "ngram", "--drafter", str(tiny_dflash), "--model", "gpt-9"]
    assert_one_line_error(run(*args), 2, "--drafter of kind dflash", "--methods has no dflash")


# --- bench: what can fail, fails in one line before the run -------------------------------


def test_plot_without_matplotlib_fails_before_the_run(monkeypatch, tmp_path):
    from specgen.cli.options import Run

    monkeypatch.setattr(Run, "load", lambda *a, **k: pytest.fail("loaded a model"))
    args = ["bench", "--plot", str(tmp_path / "b.png")]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stderr.startswith("error: --plot needs matplotlib")
    monkeypatch.undo()
    monkeypatch.setattr(Run, "load", lambda *a, **k: pytest.fail("loaded a model"))
    pytest.importorskip("matplotlib")
    result = runner.invoke(app, ["bench", "--plot", str(tmp_path / "no" / "b.png")])
    assert result.exit_code == 2 and "no such directory" in result.stderr


def test_public_suite_unreachable_is_one_line(monkeypatch, capfd, tmp_path):
    """Offline without HF_HUB_OFFLINE, huggingface_hub warns on every retry (imitated
    here): only our one line may reach the user."""
    import logging

    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(repo, filename, **kw):
        log = logging.getLogger("huggingface_hub.utils._http")
        for i in range(1, 6):
            log.warning(
                f"'[Errno -2] Name or service not known' thrown while requesting HEAD {repo}"
            )
            log.warning(f"Retrying in {2**i}s [Retry {i}/5].")
        raise LocalEntryNotFoundError("the Hub cannot be reached")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreachable)
    result = runner.invoke(app, ["bench", "--suite", "mt-bench"])
    stderr = result.stderr + capfd.readouterr().err
    assert result.exit_code == 2
    assert stderr.strip().splitlines() == [
        "error: HuggingFaceH4/mt_bench_prompts is not cached and the Hugging Face Hub cannot "
        "be reached: check the network (or a proxy, HF_ENDPOINT) and try again"
    ]


# --- a prompt file with bad lines: the good ones answered, each bad one reported ----------


def test_bad_lines_in_a_prompt_file_are_reported_in_place(tiny_llama, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "first"}\n{broken\n["x"]\n\n{"turns": ["fourth"]}\n')
    args = ["generate", "-f", str(prompts), "--model", str(tiny_llama), *FAST]
    result = run(*args, "--json")
    assert result.exit_code == 2
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == ["first", None, None, "fourth"]
    assert [r.get("line") for r in records] == [None, 2, 3, None]  # answers: the usual record
    assert "text" in records[0] and "text" in records[3]
    assert "line 2 is not valid JSON" in records[1]["error"]
    assert "line 3 is not a JSON object" in records[2]["error"]
    lines = errors(result)
    assert len(lines) == 2 and "line 2" in lines[0] and "line 3" in lines[1]
    plain = run(*args)  # the same without --json: answers on stdout, the two lines on stderr
    assert plain.exit_code == 2 and errors(plain) == lines and plain.stdout.strip()


def test_a_line_of_several_turns_is_answered_as_one_conversation(tiny_llama, tmp_path):
    """Spec-Bench's MT-Bench lines carry two turns: the second is answered after the first
    and its answer (never dropped), each turn's record saying which turn it is."""
    from specgen.api.pipeline import Pipeline

    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"turns": ["first question", "and a second one"]}\n{"prompt": "alone"}\n')
    args = ["generate", "-f", str(prompts), "--model", str(tiny_llama), *FAST]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r.get("turn"), r["prompt"]) for r in records] == [
        (1, "first question"), (2, "and a second one"), (None, "alone")
    ]
    # the second turn's prompt is the whole conversation: the first turn and its answer
    pipe = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    conversation = [
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": records[0]["text"]},
        {"role": "user", "content": "and a second one"},
    ]
    again = pipe.generate(conversation, max_new_tokens=6)
    assert records[1]["token_ids"] == again.token_ids
    assert records[1]["stats"]["prompt_tokens"] == len(pipe.encode(conversation))
    raw = run(*args, "--json", "--raw")  # no chat template: no conversation to hold them
    assert raw.exit_code == 2 and "has 2 turns: --raw answers one prompt" in errors(raw)[0]
    assert [json.loads(line)["prompt"] for line in raw.stdout.splitlines()][-1] == "alone"


# --- scripted chat: the context filling up, separators -------------------------------------


def _fake_answers(monkeypatch, limit: int) -> list[int]:
    """Every answer is "ANSWER"; a prompt over `limit` tokens fails as a full context does."""
    from specgen.api.pipeline import Chunk, Pipeline
    from specgen.models.cache.kv import ContextLimitError

    seen: list[int] = []

    def stream_ids(self, ids, **kwargs):
        seen.append(len(ids))
        if len(ids) > limit:
            raise ContextLimitError(f"prompt is {len(ids)} tokens but the context limit is {limit}")
        stats = GenStats(prompt_tokens=len(ids))
        stats.record_step(1, 0, 0, "stop")
        yield Chunk("ANSWER", (5,), stats)

    monkeypatch.setattr(Pipeline, "stream_ids", stream_ids)
    return seen


@pytest.fixture
def one_turn_limit(tiny_llama) -> int:
    """A context that holds any one short turn but not two."""
    from specgen.api.pipeline import Pipeline

    pipe = Pipeline.load(str(tiny_llama), device="cpu", dtype="float32")
    return max(len(pipe.encode([{"role": "user", "content": t}])) for t in ("one", "two")) + 2


def test_piped_chat_stops_once_when_the_context_is_full(tiny_llama, monkeypatch, one_turn_limit):
    seen = _fake_answers(monkeypatch, one_turn_limit)
    result = run("chat", "--model", str(tiny_llama), *FAST, input="one\ntwo\nthree\n/stats\n")
    assert_one_line_error(result, 2, "context limit", "ending the chat")
    assert len(seen) == 2 and result.stdout == "ANSWER\n"  # "three" was never sent


def test_chat_on_full_reset_forgets_once_and_answers_the_turn(
    tiny_llama, monkeypatch, one_turn_limit
):
    seen = _fake_answers(monkeypatch, one_turn_limit)
    args = ["chat", "--model", str(tiny_llama), *FAST, "--on-full", "reset"]
    result = run(*args, input="one\ntwo\n/stats\n")
    assert result.exit_code == 0 and not errors(result), result.stderr
    assert result.stderr.count("context full") == 1 and "2 answers" in result.stderr
    assert len(seen) == 3 and seen[2] < seen[1]  # "two" again, alone
    assert result.stdout == "ANSWER\n\nANSWER\n"  # piped answers: a blank line between
