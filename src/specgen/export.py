"""`specgen export`: the command that serves the same target and drafter on vLLM or SGLang.

For users whose load outgrows one machine. The flags are the engines' current ones
(see DESIGN.md and research/baselines.md): vLLM takes one `--speculative-config` JSON,
SGLang `--speculative-algorithm` and `--speculative-draft-model-path` plus a per-method
block flag. Pure functions: names in, argv out.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from pathlib import Path

from specgen.types.errors import SpecgenError
from specgen.hub import PACKAGED, packaged_drafter
from specgen.registry import MODELS

ENGINES = ("vllm", "sglang")
EXPORTABLE = ("dflash", "dflash2", "dspark", "eagle3")
# the published drafters' blocks (EAGLE-3: its chain of drafts, DeepSpec's ttt_length)
DEFAULT_BLOCK = {"dflash": 16, "dflash2": 8, "dspark": 7, "eagle3": 7}
BLOCK_DRAFTS = ("dflash", "dflash2")  # slot 0 is the anchor: B - 1 drafts per block
BLOCK_FIELD = {"dflash": "block_size", "dflash2": "block_size", "dspark": "block_size",
               "eagle3": "ttt_length"}  # fmt: skip


@dataclass(frozen=True)
class ServeTarget:
    target: str  # Hub repo id or local HF directory
    method: str
    drafter: str  # Hub repo id or local directory
    block_size: int  # the drafter's block (DFlash: B positions; DSpark, EAGLE-3: drafts)
    hybrid: bool = False  # recurrent layers (Qwen3.5): the engines keep state buffers
    thinking: bool | None = None  # the chat mode the drafter was trained with


def resolve_target(model: str, method: str, drafter: str | None, block: int | None) -> ServeTarget:
    """Target repo and drafter for an alias (the registry's) or a path / repo id."""
    if method not in EXPORTABLE:
        raise SpecgenError(f"--method must be one of {', '.join(EXPORTABLE)} (got {method!r})")
    entry = MODELS.get(model.lower())
    target = entry.repo if entry else model
    if target.endswith(".gguf"):
        raise SpecgenError("export serves a Hugging Face model (repo or directory), not GGUF")
    drafter = drafter or (entry.drafters.get(method) if entry else None)
    if drafter is None:
        raise SpecgenError(f"no {method} drafter is known for {model}; pass --drafter PATH|REPO")
    if drafter.startswith(PACKAGED):  # a serving engine needs the directory
        drafter = str(packaged_drafter(drafter))
    hybrid = entry.hybrid if entry else _local_model_type(target) in HYBRID_TYPES
    return ServeTarget(
        target, method, drafter, block or _block_of(drafter, method), hybrid,
        entry.thinking if entry else None,
    )  # fmt: skip


HYBRID_TYPES = ("qwen3_5", "qwen3_5_text")


def _local_model_type(target: str) -> str | None:
    config = Path(target).expanduser() / "config.json"
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None


def _block_of(drafter: str, method: str) -> int:
    """The block size in a local drafter's config, else the published default."""
    config = Path(drafter).expanduser() / "config.json"
    if config.is_file():
        try:
            cfg = json.loads(config.read_text(encoding="utf-8"))
            nested = cfg.get("dflash_config") or {}  # DFlash 2 keeps it there
            field = BLOCK_FIELD[method]
            return int(nested.get(field, cfg[field]))
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    return DEFAULT_BLOCK[method]


def launch_argv(engine: str, serve: ServeTarget, *, tp: int = 1, port: int = 8000) -> list[str]:
    if engine == "vllm":
        return _vllm(serve, tp, port)
    if engine == "sglang":
        return _sglang(serve, tp, port)
    raise SpecgenError(f"--engine must be one of {', '.join(ENGINES)} (got {engine!r})")


def _vllm(serve: ServeTarget, tp: int, port: int) -> list[str]:
    # DFlash 2 runs under vLLM's "dflash" method, which picks the DFlash 2 model from the
    # checkpoint's architecture (vLLM PR #52816's registry entry; "dflash2" is refused)
    method = "dflash" if serve.method == "dflash2" else serve.method
    config: dict[str, object] = {"method": method, "model": serve.drafter}
    if serve.method in BLOCK_DRAFTS:
        config["num_speculative_tokens"] = serve.block_size - 1  # slot 0 is the anchor
    elif serve.method == "eagle3":
        config["num_speculative_tokens"] = serve.block_size  # a chain of k drafts
    else:
        config["num_speculative_tokens"] = serve.block_size  # anchor-first: γ drafts
        config["draft_sample_method"] = "probabilistic"  # sample drafts at T > 0 (exact)
        config["enable_adaptive_verification"] = True  # vLLM's confidence scheduler
    argv = ["vllm", "serve", serve.target, "--speculative-config", json.dumps(config)]
    if serve.hybrid and serve.method == "dflash":  # z-lab's flags for its Qwen3.5 drafters
        argv += ["--attention-backend", "flash_attn", "--max-num-batched-tokens", "32768"]
    if tp > 1:
        argv += ["--tensor-parallel-size", str(tp)]
    return argv + ["--port", str(port)]


def _sglang(serve: ServeTarget, tp: int, port: int) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", serve.target]
    argv += ["--speculative-algorithm", serve.method.upper()]
    argv += ["--speculative-draft-model-path", serve.drafter]
    if serve.method in BLOCK_DRAFTS:
        argv += ["--speculative-num-draft-tokens", str(serve.block_size)]
    elif serve.method == "eagle3":  # a chain, as specgen drafts: top-1 at each of k steps
        argv += ["--speculative-num-steps", str(serve.block_size)]
        argv += ["--speculative-eagle-topk", "1"]
        argv += ["--speculative-num-draft-tokens", str(serve.block_size + 1)]
    else:
        argv += ["--speculative-dspark-block-size", str(serve.block_size)]
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


def _deepspec_eagle3(drafter: str) -> bool:
    """DeepSpec's EAGLE-3 format: by its repo name, or a local directory's config."""
    if Path(drafter).name.startswith("eagle3_") or "deepseek-ai/eagle3" in drafter:
        return True
    config = Path(drafter).expanduser() / "config.json"
    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return False
    return bool({"Qwen3Eagle3Model", "Gemma4Eagle3Model"} & set(architectures or []))


def _gemma(target: str) -> bool:
    """A Gemma 4 target: by its repo name, or a local directory's config."""
    return "gemma-4" in target.lower() or str(_local_model_type(target)).startswith("gemma4")


def notes(engine: str, serve: ServeTarget) -> list[str]:
    """What the user should know about running it."""
    out = []
    gemma = _gemma(serve.target)
    if serve.thinking is False and gemma:
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
    if gemma and engine == "vllm" and serve.method == "dflash":
        out.append(
            "z-lab's Gemma 4 drafters need a vLLM with DFlash for Gemma 4 targets "
            "(vLLM PR #41703 when this was written)"
        )
    if gemma and engine == "sglang" and serve.method == "dspark":
        out.append("SGLang's DSpark support for DeepSpec's Gemma 4 drafters is unconfirmed")
    if serve.method == "dflash2":
        pr = "vLLM PR #52816" if engine == "vllm" else "SGLang PR #35371 (DFLASH2)"
        out.append(
            f"DFlash 2 needs an engine build with it ({pr} when this was written); these flags "
            "follow that work's tests and scripts, not a released engine's docs"
        )
    if serve.method == "eagle3" and _deepspec_eagle3(serve.drafter):
        out.append(
            "DeepSpec's EAGLE-3 drafters (Qwen3Eagle3Model, Gemma4Eagle3Model: 5 taps, full "
            "vocabulary) are DeepSpec's own format; whether this engine loads them is "
            "unconfirmed"
        )
    if engine == "vllm" and serve.method == "dspark":
        out.append(
            "enable_adaptive_verification needs full CUDA-graph mode; drop it to verify every draft"
        )
    return out
