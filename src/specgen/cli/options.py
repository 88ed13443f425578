"""Options shared by the commands, defined once (DESIGN.md §5)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated

import typer

from specgen.pipeline import METHODS
from specgen.registry import DEFAULT_ALIAS

# Only methods that work are offered: plain AR plus every registered drafter.
Method = Enum("Method", {name: name for name in METHODS}, type=str)


ModelOpt = Annotated[
    str,
    typer.Option(
        "--model",
        "-m",
        help="Alias (see `specgen models`), local directory, .gguf file or Hub repo.",
    ),
]
MethodOpt = Annotated[
    Method, typer.Option("--method", help="Decoding method (ar = no speculation).")
]
DrafterOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--drafter",
        help="Drafter checkpoint (directory or Hub repo) instead of the registry's; its kind "
        "sets --method when that is not given. Give two (DFlash + DSpark) for stacked.",
    ),
]
BlockSizeOpt = Annotated[
    int | None,
    typer.Option("--block-size", help="Run a block drafter at a smaller block than trained."),
]
VerifyPolicyOpt = Annotated[
    str,
    typer.Option(
        "--verify-policy",
        help="How many draft tokens each step verifies: cost (best expected tokens/s from "
        "confidences and measured costs), full, or threshold=X (while each token's "
        "acceptance estimate is >= X).",
    ),
]
TraceOpt = Annotated[
    bool,
    typer.Option("--trace", help="With --json: one record per step (draft, verify length, ...)."),
]
DraftTokensOpt = Annotated[
    int | None,
    typer.Option(
        "--draft-tokens", "-k", help="Most tokens drafted per step (default: per method)."
    ),
]
MaxNewTokensOpt = Annotated[
    int, typer.Option("--max-new-tokens", "-n", help="Most tokens to generate per answer.")
]
TemperatureOpt = Annotated[
    float, typer.Option("--temperature", "-t", help="0 = greedy; > 0 samples.")
]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass (1 = off).")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Sample among the k likeliest (0 = off).")]
SeedOpt = Annotated[
    int | None, typer.Option("--seed", help="Seed for sampling (reproducible runs).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda[:N].")]
DtypeOpt = Annotated[
    str,
    typer.Option("--dtype", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16 or float16."),
]
ContextOpt = Annotated[
    int | None,
    typer.Option("--context", help="KV-cache size in tokens (default: min(model limit, 8192))."),
]
RawOpt = Annotated[
    bool, typer.Option("--raw", help="Send the prompt as is, without the chat template.")
]
ThinkOpt = Annotated[
    bool,
    typer.Option(
        "--think/--no-think",
        help="Qwen3 thinking mode (off by default: public drafters were trained without it).",
    ),
]
JsonOpt = Annotated[
    bool, typer.Option("--json", help="One JSON object per prompt: prompt, text, token_ids, stats.")
]
QuietOpt = Annotated[
    bool, typer.Option("--quiet", "-q", help="Print only the answer: no status or stats.")
]
EngineOpt = Annotated[
    str,
    typer.Option(
        "--engine",
        help="overlap (decode in a compute thread, ahead of printing; on CUDA each "
        "speculative step is queued before the last one's result is read), sync (the "
        "plain loop), or auto (overlap on CUDA, sync on the CPU).",
    ),
]
CudaGraphsOpt = Annotated[
    bool,
    typer.Option(
        "--cuda-graphs/--no-cuda-graphs",
        help="On CUDA, replay decode and verify steps as CUDA graphs (off: eager forward).",
    ),
]
ShowDraftsOpt = Annotated[
    bool,
    typer.Option("--show-drafts", help="Live view: colour text from accepted draft tokens (cyan)."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]

DEFAULT_MODEL = DEFAULT_ALIAS
