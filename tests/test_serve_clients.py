"""Real clients against a real `specgen serve`, unchanged: lm-eval's `local-completions`
running a loglikelihood task (benchmarks/lm_eval_task), and simonw's `llm` CLI. Each is
skipped only when the client is not installed (found on PATH, or named by
SPECGEN_LM_EVAL / SPECGEN_LLM: heavy tools live in a virtual environment of their own)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specgen.api.pipeline import Pipeline
from specgen.core.config import SamplingParams
from support.serve import CPU, Server

# servers, subprocesses or whole CLI runs: not the quick tier
pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[1]
LM_EVAL = os.environ.get("SPECGEN_LM_EVAL") or shutil.which("lm_eval")
LLM = os.environ.get("SPECGEN_LLM") or shutil.which("llm")
TASK = "specgen_tiny_choice"


@pytest.fixture(scope="module")
def ar(tiny_qwen3_deep):
    return Pipeline.load(str(tiny_qwen3_deep), device="cpu", dtype="float32")


def offline(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "datasets"), **extra}  # fmt: skip
    env.pop("PYTHONPATH", None)  # the client's own environment, not specgen's sources
    return env


def loglikelihood(pipe: Pipeline, context: str, continuation: str) -> tuple[float, bool]:
    """What lm-eval asks of a (context, continuation) pair, from the library: the
    continuation's tokens split off as lm-eval splits them, their logprobs summed, and
    whether each is the likeliest token at its position."""
    tok = pipe.codec.tokenizer
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    whole = tok(context + continuation, add_special_tokens=False)["input_ids"]
    start = len(tok(context, add_special_tokens=False)["input_ids"])
    scored = pipe.prompt_logprobs(whole, top=1, session=pipe.new_session())[start - 1 :]
    return sum(s.logprob for s in scored), all(s.token == s.top[0][0] for s in scored)


@pytest.mark.skipif(LM_EVAL is None, reason="lm-eval not installed (or set SPECGEN_LM_EVAL)")
def test_lm_eval_runs_a_loglikelihood_task_with_the_library_s_values(
    tiny_qwen3_deep, tiny_dflash, ar, tmp_path
):
    """Through DFlash, as a user would serve it; lm-eval tokenizes through the server's
    /tokenize (no Hub tokenizer), and every choice's loglikelihood and greediness it
    records is the library's own scoring of the same tokens."""
    srv = Server("--model", str(tiny_qwen3_deep), "--method", "dflash", "--drafter",
                 str(tiny_dflash), "--verify-policy", "full", *CPU)  # fmt: skip
    try:
        model = srv.ready.split()[1]
        args = f"base_url={srv.base}/completions,model={model}"
        cmd = [LM_EVAL, "--model", "local-completions", "--model_args", args, "--tasks", TASK,
               "--include_path", "benchmarks/lm_eval_task", "--output_path", str(tmp_path),
               "--log_samples"]  # fmt: skip
        done = subprocess.run(cmd, cwd=REPO, env=offline(tmp_path), capture_output=True,
                              text=True, timeout=1200)  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    finally:
        srv.stop()
    assert "Using remote tokenizer" in done.stderr  # lm-eval found /tokenizer_info, /tokenize
    (samples,) = tmp_path.glob(f"*/samples_{TASK}_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(rows) == 24
    correct = 0
    for row in rows:
        pairs = [(a["arg_0"], a["arg_1"]) for a in row["arguments"].values()]
        want = [loglikelihood(ar, c, x) for c, x in pairs]
        got = [(float(ll), greedy == "True") for ll, greedy in row["filtered_resps"]]
        assert [g for _, g in got] == [g for _, g in want]
        assert [ll for ll, _ in got] == pytest.approx([ll for ll, _ in want], abs=1e-4)
        best = max(range(len(want)), key=lambda i: want[i][0])
        assert row["acc"] == float(best == row["doc"]["answer"])
        correct += best == row["doc"]["answer"]
    (results,) = tmp_path.glob("*/results_*.json")
    acc = json.loads(results.read_text())["results"][TASK]["acc,none"]
    assert acc == pytest.approx(correct / len(rows))


def run_llm(*args: str, env: dict[str, str]) -> str:
    done = subprocess.run([LLM, *args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.skipif(LLM is None, reason="llm not installed (or set SPECGEN_LLM)")
def test_llm_chats_and_completes_with_the_library_s_answers(
    tiny_qwen3_deep, tiny_dflash, ar, tmp_path
):
    srv = Server("--model", str(tiny_qwen3_deep), "--method", "dflash", "--drafter",
                 str(tiny_dflash), "--verify-policy", "full", *CPU)  # fmt: skip
    try:
        model = srv.ready.split()[1]
        (tmp_path / "extra-openai-models.yaml").write_text(
            f"- model_id: specgen\n  model_name: {model}\n  api_base: {srv.base}\n"
            f"- model_id: specgen-completion\n  model_name: {model}\n  api_base: {srv.base}\n"
            "  completion: true\n"
        )
        env = offline(tmp_path, LLM_USER_PATH=str(tmp_path))
        text = "The quick brown fox"
        n = ["-o", "max_tokens", "12"]
        want = ar.generate(text, max_new_tokens=12, session=ar.new_session()).text
        assert run_llm("-m", "specgen", *n, text, env=env) == want + "\n"  # streamed
        assert run_llm("-m", "specgen", "--no-stream", *n, text, env=env) == want + "\n"
        penalised = SamplingParams(frequency_penalty=1.5, presence_penalty=0.5)
        want = ar.generate(text, sampling=penalised, max_new_tokens=12).text
        got = run_llm("-m", "specgen", *n, "-o", "frequency_penalty", "1.5", "-o",
                      "presence_penalty", "0.5", text, env=env)  # fmt: skip
        assert got == want + "\n"
        raw = ar.generate(text, raw=True, max_new_tokens=12, session=ar.new_session())
        got = run_llm("-m", "specgen-completion", *n, "-o", "logprobs", "2", text, env=env)
        assert got == raw.text + "\n"
        (logged,) = json.loads(run_llm("logs", "-n", "1", "--json", env=env))
        positions = [
            p for chunk in logged["response_json"]["logprobs"] for p in chunk["top_logprobs"]
        ]
        assert len(positions) == len(raw.token_ids) and all(1 <= len(p) <= 3 for p in positions)
    finally:
        srv.stop()
