"""`specgen export`: the launch commands, tested as text."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

from specgen.cli import app
from specgen.core.errors import SpecgenError
from specgen.export import bench_command, launch_command, notes, resolve_target

runner = CliRunner()


def test_vllm_dspark_uses_one_speculative_config():
    serve = resolve_target("qwen3-8b", "dspark", None, None)
    argv = shlex.split(launch_command("vllm", serve))
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {
        "method": "dspark",
        "model": "deepseek-ai/dspark_qwen3_8b_block7",
        "num_speculative_tokens": 7,
        "draft_sample_method": "probabilistic",
        "enable_adaptive_verification": True,
    }


def test_vllm_dflash_drafts_block_minus_one():
    serve = resolve_target("qwen3-4b", "dflash", None, None)
    argv = shlex.split(launch_command("vllm", serve, tp=2, port=9000))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "dflash", "model": "z-lab/Qwen3-4B-DFlash-b16",
                      "num_speculative_tokens": 15}  # fmt: skip
    assert argv[-4:] == ["--tensor-parallel-size", "2", "--port", "9000"]


def test_sglang_commands():
    dflash = launch_command("sglang", resolve_target("qwen3-8b", "dflash", None, None))
    assert dflash == (
        "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm "
        "DFLASH --speculative-draft-model-path z-lab/Qwen3-8B-DFlash-b16 "
        "--speculative-num-draft-tokens 16 --port 8000"
    )
    dspark = launch_command("sglang", resolve_target("qwen3-14b", "dspark", None, None), tp=4)
    assert "--speculative-algorithm DSPARK" in dspark
    assert "--speculative-dspark-block-size 7 --tp 4" in dspark


def test_local_drafter_block_is_read_from_its_config(tmp_path, tiny_dspark):
    serve = resolve_target(str(tmp_path / "model"), "dspark", str(tiny_dspark), None)
    assert serve.block_size == 7 and serve.target == str(tmp_path / "model")
    assert resolve_target("qwen3-8b", "dspark", str(tiny_dspark), 5).block_size == 5


def test_dflash2_commands(tmp_path, tiny_dflash2):
    """vLLM: its "dflash" method (the checkpoint's architecture selects DFlash 2), B - 1
    drafts; SGLang: DFLASH2 with B draft tokens. The block is read from dflash_config."""
    serve = resolve_target("Qwen/Qwen3.8-27B", "dflash2", str(tiny_dflash2), None)
    assert serve.block_size == 8
    vllm = launch_command("vllm", serve)
    assert '{"method": "dflash", "model": "' + str(tiny_dflash2) in vllm
    assert '"num_speculative_tokens": 7}' in vllm
    sglang = launch_command("sglang", serve)
    assert "--speculative-algorithm DFLASH2 --speculative-draft-model-path" in sglang
    assert "--speculative-num-draft-tokens 8 --port 8000" in sglang
    assert any("DFlash 2 needs an engine build" in n for n in notes("vllm", serve))
    with pytest.raises(SpecgenError, match="no dflash2 drafter is known for qwen3-8b"):
        resolve_target("qwen3-8b", "dflash2", None, None)


@pytest.mark.parametrize(
    "args, message",
    [
        (("qwen3-14b", "dflash", None, None), "no dflash drafter is known for qwen3-14b"),
        (
            ("qwen3-8b", "ngram", None, None),
            "--method must be one of dflash, dflash2, draft, dspark",
        ),
        (("model.gguf", "dflash", "d", None), "not GGUF"),
    ],
)
def test_bad_exports(args, message):
    with pytest.raises(SpecgenError, match=message):
        resolve_target(*args)


def test_cli_prints_the_command_on_stdout_and_notes_on_stderr():
    result = runner.invoke(
        app, ["export", "--model", "qwen3-8b", "--method", "dspark", "--engine", "sglang"]
    )
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("python -m sglang.launch_server --model-path Qwen/Qwen3-8B")
    assert "enable_thinking" in result.stderr
    bad = runner.invoke(app, ["export", "--method", "dspark", "--engine", "tgi", "-m", "qwen3-8b"])
    assert bad.exit_code == 2 and "--engine must be one of vllm, sglang" in bad.stderr


def test_qwen3_5_and_llama_exports():
    """z-lab's flags for its Qwen3.5 drafters, and engines' state buffers for hybrid targets."""
    vllm = shlex.split(launch_command("vllm", resolve_target("qwen3.5-9b", "dflash", None, None)))
    assert vllm[:3] == ["vllm", "serve", "Qwen/Qwen3.5-9B"]
    config = json.loads(vllm[vllm.index("--speculative-config") + 1])
    assert config == {"method": "dflash", "model": "z-lab/Qwen3.5-9B-DFlash",
                      "num_speculative_tokens": 15}  # fmt: skip
    assert vllm[vllm.index("--attention-backend") + 1] == "flash_attn"
    sglang = launch_command("sglang", resolve_target("qwen3.5-27b", "dflash", None, None))
    assert "--speculative-draft-model-path z-lab/Qwen3.5-27B-DFlash" in sglang
    assert "--mamba-scheduler-strategy extra_buffer" in sglang
    llama = resolve_target("llama3.1-8b", "dflash", None, None)
    assert llama.target == "meta-llama/Llama-3.1-8B-Instruct" and not llama.hybrid
    assert llama.drafter == "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"


def test_a_local_qwen3_5_directory_exports_as_hybrid(tiny_qwen3_5, tiny_dflash):
    serve = resolve_target(str(tiny_qwen3_5), "dflash", str(tiny_dflash), None)
    assert serve.hybrid and serve.block_size == 8
    assert "extra_buffer" in launch_command("sglang", serve)


def test_the_thinking_note_follows_the_drafters_training():
    args = ["export", "--method", "dflash", "--engine", "vllm", "--model"]
    qwen35 = runner.invoke(app, [*args, "qwen3.5-4b"])
    assert qwen35.exit_code == 0 and "trained with thinking on" in qwen35.stderr
    qwen3 = runner.invoke(app, [*args, "qwen3-4b"])
    assert '"enable_thinking": false' in qwen3.stderr and "thinking on" not in qwen3.stderr


def test_the_bench_line_that_measures_the_server(tmp_path, tiny_dflash):
    """`specgen bench --endpoint` at the launch line's port, for the name the engines serve
    the target under, in the chat mode its drafters were trained with."""
    qwen3 = shlex.split(bench_command(resolve_target("qwen3-8b", "dflash", None, None), port=9001))
    assert qwen3 == [
        "specgen", "bench", "--endpoint", "http://127.0.0.1:9001/v1", "--endpoint-model",
        "Qwen/Qwen3-8B", "--suite", "builtin", "--methods", "none", "--no-think",
    ]  # fmt: skip
    qwen35 = bench_command(resolve_target("qwen3.5-9b", "dflash", None, None))
    assert qwen35.endswith(
        "--endpoint-model Qwen/Qwen3.5-9B --suite builtin --methods none --think"
    )
    local = resolve_target(str(tmp_path / "my model"), "dflash", str(tiny_dflash), None)
    # no thinking flag: nothing says which mode a local drafter wants
    argv = shlex.split(bench_command(local, suite="mt-bench"))
    assert argv[5:] == [str(tmp_path / "my model"), "--suite", "mt-bench", "--methods", "none"]


def test_the_cli_adds_the_bench_line_on_stderr_only():
    args = ["export", "--model", "qwen3-8b", "--method", "dflash", "--engine", "vllm"]
    result = runner.invoke(app, [*args, "--port", "9001"])
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1  # stdout: the launch line alone
    assert result.stdout.startswith("vllm serve Qwen/Qwen3-8B") and "9001" in result.stdout
    assert (
        "measure it: specgen bench --endpoint http://127.0.0.1:9001/v1 --endpoint-model "
        "Qwen/Qwen3-8B --suite builtin --methods none --no-think"
    ) in result.stderr
    assert "--per-request-spec-decode-metrics summary" in result.stderr
    sglang = runner.invoke(app, [*args[:-1], "sglang"])
    assert "measure it: specgen bench --endpoint http://127.0.0.1:8000/v1" in sglang.stderr
    assert "per-request-spec-decode-metrics" not in sglang.stderr


def test_mtp_names_no_drafter_on_either_engine():
    """The target's own MTP layers: vLLM's `mtp` method, SGLang's NEXTN, no draft model."""
    serve = resolve_target("qwen3.5-4b", "mtp", None, None)
    argv = shlex.split(launch_command("vllm", serve))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {"method": "mtp", "num_speculative_tokens": 3}
    argv = shlex.split(launch_command("sglang", serve))
    assert "--speculative-draft-model-path" not in argv
    assert argv[argv.index("--speculative-algorithm") + 1] == "NEXTN"
    assert argv[argv.index("--speculative-num-steps") + 1] == "3"
    assert argv[argv.index("--speculative-num-draft-tokens") + 1] == "4"
    said = " ".join(notes("sglang", serve))
    assert "--spec-type draft-mtp --spec-draft-n-max 3" in said and "z-lab" not in said
    argv = shlex.split(launch_command("vllm", resolve_target("qwen3.5-4b", "mtp", None, 2)))
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 2
