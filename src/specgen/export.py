"""`specgen export`: the command that serves the same target and drafter on vLLM or SGLang.

For users whose load outgrows one machine. The flags are the engines' current ones
(see DESIGN.md and research/baselines.md): vLLM takes one `--speculative-config` JSON,
SGLang `--speculative-algorithm` and `--speculative-draft-model-path` plus a per-method
block flag; what differs per method is its package's `ExportHints`. Pure functions: names
in, argv out.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from specgen.api.spec import no_drafter
from specgen.core.errors import SpecgenError
from specgen.drafting.export_hints import ExportHints, ServeTarget
from specgen.hub import PACKAGED, packaged_drafter
from specgen.methods import DRAFTERS
from specgen.registry import MODELS

ENGINES = ("vllm", "sglang")
# the methods another engine serves: those whose package says how (`DraftMethod.export`)
EXPORTABLE = tuple(name for name, cls in DRAFTERS.items() if cls.export is not None)
HYBRID_TYPES = ("qwen3_5", "qwen3_5_text")


def _hints(method: str) -> ExportHints:
    return DRAFTERS[method].export


def resolve_target(model: str, method: str, drafter: str | None, block: int | None) -> ServeTarget:
    """Target repo and drafter for an alias (the registry's) or a path / repo id."""
    if method not in EXPORTABLE:
        raise SpecgenError(f"--method must be one of {', '.join(EXPORTABLE)} (got {method!r})")
    entry = MODELS.get(model.lower())
    target = entry.repo if entry else model
    if target.endswith(".gguf"):
        raise SpecgenError("export serves a Hugging Face model (repo or directory), not GGUF")
    drafter = drafter or (entry.drafters.get(method) if entry else None)
    if drafter is None and _hints(method).own_head:
        drafter = ""  # the target's own layers draft (MTP)
    if drafter is None:
        raise SpecgenError(no_drafter(method, model))
    if drafter.startswith(PACKAGED):  # a serving engine needs the directory
        drafter = str(packaged_drafter(drafter))
    elif drafter.lower() in MODELS:  # a draft model named by its alias: its repo
        drafter = MODELS[drafter.lower()].repo
    hybrid = entry.hybrid if entry else _local_model_type(target) in HYBRID_TYPES
    return ServeTarget(
        target, method, drafter, block or _hints(method).block_of(drafter), hybrid,
        entry.thinking if entry else None, _gemma(target),
    )  # fmt: skip


def _local_model_type(target: str) -> str | None:
    config = Path(target).expanduser() / "config.json"
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _gemma(target: str) -> bool:
    """A Gemma 4 target: by its repo name, or a local directory's config."""
    return "gemma-4" in target.lower() or str(_local_model_type(target)).startswith("gemma4")


def launch_argv(engine: str, serve: ServeTarget, *, tp: int = 1, port: int = 8000) -> list[str]:
    if engine == "vllm":
        return _vllm(serve, tp, port)
    if engine == "sglang":
        return _sglang(serve, tp, port)
    raise SpecgenError(f"--engine must be one of {', '.join(ENGINES)} (got {engine!r})")


def _vllm(serve: ServeTarget, tp: int, port: int) -> list[str]:
    hints = _hints(serve.method)
    config = json.dumps(hints.vllm_config(serve))
    argv = ["vllm", "serve", serve.target, "--speculative-config", config]
    argv += hints.vllm_flags(serve)
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    return argv + ["--port", str(port)]


def _sglang(serve: ServeTarget, tp: int, port: int) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", serve.target]
    hints = _hints(serve.method)
    argv += ["--speculative-algorithm", hints.sglang_algorithm or serve.method.upper()]
    if serve.drafter:  # (a target's own head drafts without one)
        argv += ["--speculative-draft-model-path", serve.drafter]
    argv += hints.sglang_flags(serve)
    if serve.hybrid:  # room for the recurrent state of every draft position
        argv += ["--mamba-scheduler-strategy", "extra_buffer"]
    if tp > 1:
        argv += ["--tp", str(tp)]
    return argv + ["--port", str(port)]


def launch_command(engine: str, serve: ServeTarget, *, tp: int = 1, port: int = 8000) -> str:
    """The command as one shell line (the JSON config safely quoted)."""
    return shlex.join(launch_argv(engine, serve, tp=tp, port=port))


def bench_command(serve: ServeTarget, *, port: int = 8000, suite: str = "builtin") -> str:
    """The `specgen bench` line that measures the launched server: the same suite over its
    OpenAI API (the engines serve the target under its repo or path), endpoint alone (a
    local copy of the target next to the engine's would not fit most GPUs), in the chat
    mode the drafter was trained with."""
    argv = ["specgen", "bench", "--endpoint", f"http://127.0.0.1:{port}/v1"]
    argv += ["--endpoint-model", serve.target, "--suite", suite, "--methods", "none"]
    if serve.thinking is not None:
        argv.append("--think" if serve.thinking else "--no-think")
    return shlex.join(argv)


def notes(engine: str, serve: ServeTarget) -> list[str]:
    """What the user should know about running it: the chat mode and the target's kind
    here, the method's own after them."""
    out: list[str] = []
    if _hints(serve.method).own_head:  # the target's own head: no drafter's training to match
        return out + _hints(serve.method).notes(engine, serve)
    if serve.thinking is False and serve.gemma:
        out.append(
            "the Gemma 4 drafters were trained on non-thinking answers (DeepSpec's; z-lab's "
            'card says nothing): send "chat_template_kwargs": {"enable_thinking": false} or '
            "leave it out (the template's default)"
        )
    elif serve.thinking is False:
        out.append(
            "the public Qwen3 drafters were trained without thinking: send "
            '"chat_template_kwargs": {"enable_thinking": false} with each request'
        )
    if serve.thinking is True:
        out.append(
            "z-lab's Qwen3.5 drafters were trained with thinking on (the template's default): "
            'keep "enable_thinking" on, or acceptance drops'
        )
    if serve.hybrid and engine == "vllm":
        out.append(
            "z-lab's sliding-window drafters (27B) need a vLLM with interleaved-SWA drafters "
            "(z-lab's README names the build)"
        )
    return out + _hints(serve.method).notes(engine, serve)
