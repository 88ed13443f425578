"""`specgen export --method eagle3`: the vLLM and SGLang launch lines, as text."""

from __future__ import annotations

import json
import shlex

from typer.testing import CliRunner

from specgen.cli import app
from specgen.export import launch_command, notes, resolve_target
from specgen.registry import MODELS
from support.eagle3 import save_eagle3


def test_registry_pairs_the_public_eagle3_drafters():
    assert MODELS["qwen3-8b"].drafters["eagle3"] == "deepseek-ai/eagle3_qwen3_8b_ttt7"
    assert MODELS["qwen3-4b"].drafters["eagle3"] == "deepseek-ai/eagle3_qwen3_4b_ttt7"
    assert MODELS["qwen3-14b"].drafters["eagle3"] == "deepseek-ai/eagle3_qwen3_14b_ttt7"
    assert MODELS["llama3.1-8b"].drafters["eagle3"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert MODELS["gemma-4-12b"].drafters["eagle3"] == "deepseek-ai/eagle3_gemma4_12b_ttt7"


def test_the_gemma_eagle3_exports_with_its_notes():
    serve = resolve_target("gemma-4-12b", "eagle3", None, None)
    assert serve.block_size == 7 and serve.drafter == "deepseek-ai/eagle3_gemma4_12b_ttt7"
    argv = shlex.split(launch_command("vllm", serve))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert argv[2] == "google/gemma-4-12B-it" and config["model"] == serve.drafter
    assert config["num_speculative_tokens"] == 7
    said = notes("vllm", serve)
    assert any("Gemma4Eagle3Model" in n and "unconfirmed" in n for n in said)
    assert any('"enable_thinking": false' in n for n in said)


def test_vllm_eagle3_drafts_a_chain():
    serve = resolve_target("llama3.1-8b", "eagle3", None, None)
    argv = shlex.split(launch_command("vllm", serve))
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    assert config == {
        "method": "eagle3",
        "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 7,
    }
    assert not any("DeepSpec" in n for n in notes("vllm", serve))


def test_sglang_eagle3_is_a_top1_chain():
    serve = resolve_target("qwen3-8b", "eagle3", None, 5)
    assert launch_command("sglang", serve) == (
        "python -m sglang.launch_server --model-path Qwen/Qwen3-8B --speculative-algorithm "
        "EAGLE3 --speculative-draft-model-path deepseek-ai/eagle3_qwen3_8b_ttt7 "
        "--speculative-num-steps 5 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 6 --port 8000"
    )
    assert any("DeepSpec's EAGLE-3 drafters" in n for n in notes("sglang", serve))


def test_local_deepspec_chain_is_read_from_ttt_length(tmp_path):
    from support.eagle3 import save_target

    target = save_target(tmp_path / "t")
    drafter = save_eagle3(tmp_path / "d", "deepspec", target=target, edit={"ttt_length": 4})
    serve = resolve_target(str(target), "eagle3", str(drafter), None)
    assert serve.block_size == 4
    assert any("DeepSpec's EAGLE-3 drafters" in n for n in notes("vllm", serve))


def test_cli_exports_eagle3():
    result = CliRunner().invoke(
        app, ["export", "--model", "qwen3-4b", "--method", "eagle3", "--engine", "vllm"]
    )
    assert result.exit_code == 0, result.stderr
    assert '"method": "eagle3"' in result.stdout
