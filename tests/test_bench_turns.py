"""`specgen bench --turns all`: a suite's conversations answered turn by turn, each turn
asked with the method's own earlier answers, in process and through `specgen serve`
(several methods of one server raced, its `ar` the baseline). No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specgen.api.pipeline import Pipeline
from specgen.bench.harness import run_bench
from specgen.bench.suites import BenchPrompt, load_suite
from specgen.cli import app
from specgen.core.config import SamplingParams, SpecConfig
from specgen.core.errors import PromptError, SpecgenError
from support.serve import CPU, Server

runner = CliRunner()
AGENT_SUITE = Path(__file__).parents[1] / "benchmarks" / "prompts" / "agent_suite.jsonl"
TURNS = ["one two three four, one two three four", "again: one two three four", "and once more"]


def _suite(tmp_path, *rows) -> Path:
    path = tmp_path / "suite.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def test_a_suite_keeps_its_turns_only_when_asked(tmp_path):
    path = _suite(tmp_path, {"category": "c", "turns": TURNS}, {"prompt": "single"})
    first = load_suite(str(path))
    assert [p.turns for p in first] == [(TURNS[0],), ("single",)]
    every = load_suite(str(path), turns="all")
    assert [p.turns for p in every] == [tuple(TURNS), ("single",)]
    with pytest.raises(PromptError, match="line 1 has a turn that is not text"):
        load_suite(str(_suite(tmp_path, {"category": "c", "turns": ["a", " "]})), turns="all")
    with pytest.raises(SpecgenError, match="--turns must be first or all"):
        load_suite(str(path), turns="some")


def test_the_agent_suite_is_ten_conversations_of_four_to_six_turns():
    suite = load_suite(str(AGENT_SUITE), turns="all")
    assert len(suite) == 10 and all(4 <= len(p.turns) <= 6 for p in suite)
    assert len({p.category for p in suite}) == 10


@pytest.fixture(scope="module")
def pipes(tiny_qwen3_deep):
    ar = Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")
    suffix = ar.with_spec(SpecConfig(method="suffix", verify_policy="full"))
    return {"ar": ar, "suffix": suffix}


def test_a_conversation_is_answered_turn_by_turn_with_its_own_answers(pipes):
    run = run_bench(pipes, [BenchPrompt("c", TURNS[0], tuple(TURNS[1:]))], max_new_tokens=10,
                    sampling=SamplingParams(), repeats=2)  # fmt: skip
    by = {(r.method, r.turn): r for r in run.runs}
    assert sorted(by) == [(m, t) for m in ("ar", "suffix") for t in range(3)]
    assert run.compared == {"suffix": 3} and run.identical == {"suffix": 3}
    ar = pipes["ar"]
    for turn in (1, 2):  # asked with the conversation so far, its own answers in it
        history = []
        for t in range(turn):
            history += [{"role": "user", "content": TURNS[t]},
                        {"role": "assistant", "content": by[("ar", t)].text}]  # fmt: skip
        want = ar.encode([*history, {"role": "user", "content": TURNS[turn]}])
        assert by[("ar", turn)].prompt_ids == want == by[("suffix", turn)].prompt_ids
        # one session holds the conversation: a later turn prefills only what is new
        assert by[("ar", turn)].stats.prefill_tokens < len(want)
        # and each repeat started where the turn started (the same steps, not a re-answer)
        assert by[("ar", turn)].stats.steps == len(by[("ar", turn)].tokens)


@pytest.fixture(scope="module")
def server(tiny_qwen3_deep):
    srv = Server("--model", str(tiny_qwen3_deep), "--methods", "ar,suffix",
                 "--verify-policy", "full", "--quiet", *CPU)  # fmt: skip
    yield srv
    srv.stop()


def test_methods_of_one_server_raced_on_conversations(server, tmp_path):
    suite = _suite(tmp_path, {"category": "c", "turns": TURNS})
    args = ["bench", "--suite", str(suite), "--turns", "all", "--max-new-tokens", "10",
            "--json", "--quiet", "--methods", "none",
            "--endpoint", server.base, "--endpoint-method", "ar",
            "--endpoint", server.base, "--endpoint-method", "suffix"]  # fmt: skip
    result = runner.invoke(app, args, env={"OPENAI_API_KEY": None})
    assert result.exit_code == 0, result.stderr
    last = json.loads(result.stdout.strip().splitlines()[-1])
    host = server.base.split("//")[1].removesuffix("/v1")
    ar, suffix = f"endpoint:{host}/ar", f"endpoint:{host}/suffix"
    assert last["methods"] == [ar, suffix] and last["baseline"] == ar
    assert last["turns"] == "all" and last["results"][suffix]["all"]["prompts"] == 3
    assert last["results"][suffix]["all"]["speedup"] > 0  # over the server's own AR
    assert last["results"][ar]["all"]["tau"] == 1.0
    assert last["lossless"][suffix]["match_rate"] == 1.0  # text for text, every turn


def test_bad_endpoint_method_options_are_one_line(tmp_path):
    from support.cli import assert_one_line_error

    result = runner.invoke(
        app,
        [
            "bench",
            "--methods",
            "none",
            "--endpoint",
            "http://h:1/v1",
            "--endpoint-method",
            "ar",
            "--endpoint-method",
            "suffix",
        ],
    )
    assert_one_line_error(result, 2, "2 --endpoint-method for 1 --endpoint: one each")
    result = runner.invoke(app, ["bench", "--endpoint-method", "ar"])
    assert_one_line_error(result, 2, "need an --endpoint URL")
