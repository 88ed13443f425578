"""Options shared by the commands, defined once (DESIGN.md §5).

`@run_options(...)` gives a command the shared options it names (with its own defaults
where they differ) and hands them to it as one `Run`, which builds the `SpecConfig`, the
`SamplingParams` and the loaded pipeline the same way for every command.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer

from specgen.config import SamplingParams, SpecConfig
from specgen.errors import SpecgenError
from specgen.registry import DEFAULT_ALIAS

if TYPE_CHECKING:
    from specgen.pipeline import Pipeline

DEFAULT_MODEL = DEFAULT_ALIAS


def _methods() -> tuple[str, ...]:
    from specgen.drafting import DRAFTERS

    return ("ar", *DRAFTERS)


# Only methods that work are offered: plain AR plus every registered drafter.
Method = Enum("Method", {name: name for name in _methods()}, type=str)


def _option(kind: Any, *decls: str, help: str) -> Any:
    return Annotated[kind, typer.Option(*decls, help=help)]


ModelOpt = _option(
    str,
    "--model",
    "-m",
    help="Alias (see `specgen models`), local directory, .gguf file or Hub repo.",
)
DeviceOpt = _option(str, "--device", help="auto, cpu or cuda[:N].")
JsonOpt = _option(
    bool, "--json", help="One JSON object per prompt: prompt, text, token_ids, stats."
)
DebugOpt = _option(bool, "--debug", help="Show tracebacks for errors.")

OPTIONS: dict[str, tuple[Any, Any]] = {  # name -> (annotation, default)
    "model": (ModelOpt, DEFAULT_MODEL),
    # None = not given: plain decoding, or the --drafter's kind (Run.spec tells them apart)
    "method": (
        _option(
            Method | None,
            "--method",
            help="Decoding method (ar = no speculation). Default: ar, or the kind of the "
            "--drafter given.",
        ),
        None,
    ),
    "drafter": (
        _option(
            list[str] | None,
            "--drafter",
            help="Drafter checkpoint (directory or Hub repo) instead of the registry's; its kind "
            "sets --method when that is not given. Give two (DFlash + DSpark) for stacked.",
        ),
        None,
    ),
    "draft_tokens": (
        _option(
            int | None,
            "--draft-tokens",
            "-k",
            help="Most tokens drafted per step (default: per method).",
        ),
        None,
    ),
    "block_size": (
        _option(
            int | None, "--block-size", help="Run a block drafter at a smaller block than trained."
        ),
        None,
    ),
    "verify_policy": (
        _option(
            str,
            "--verify-policy",
            help="How many draft tokens each step verifies: cost (best expected tokens/s from "
            "confidences and measured costs), full, or threshold=X (while each token's "
            "acceptance estimate is >= X).",
        ),
        "cost",
    ),
    "engine": (
        _option(
            str,
            "--engine",
            help="auto (overlap on CUDA, sync on the CPU), overlap (decode in a thread of its "
            "own, ahead of printing; on CUDA each speculative step is queued before the last "
            "one's result is read) or sync (the plain loop).",
        ),
        "auto",
    ),
    "cuda_graphs": (
        _option(
            bool,
            "--cuda-graphs/--no-cuda-graphs",
            help="On CUDA, replay decode and verify steps as CUDA graphs (off: eager).",
        ),
        True,
    ),
    "max_new_tokens": (
        _option(int, "--max-new-tokens", "-n", help="Most tokens to generate per answer."),
        256,
    ),
    "temperature": (_option(float, "--temperature", "-t", help="0 = greedy; > 0 samples."), 0.0),
    "top_p": (_option(float, "--top-p", help="Nucleus sampling mass (1 = off)."), 1.0),
    "top_k": (_option(int, "--top-k", help="Sample among the k likeliest (0 = off)."), 0),
    "seed": (_option(int | None, "--seed", help="Seed for sampling (reproducible runs)."), None),
    "device": (DeviceOpt, "auto"),
    "dtype": (
        _option(
            str, "--dtype", help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16 or float16."
        ),
        "auto",
    ),
    "context": (
        _option(
            int | None,
            "--context",
            help="KV-cache size in tokens (default: min(model limit, 8192)).",
        ),
        None,
    ),
    "think": (
        _option(
            bool | None,
            "--think/--no-think",
            help="The chat template's thinking mode (Qwen3, Qwen3.5). Default: what the "
            "model's drafters were trained with (`specgen models`: off for Qwen3, on for "
            "Qwen3.5); the other mode lowers acceptance.",
        ),
        None,
    ),
    "show_drafts": (
        _option(
            bool, "--show-drafts", help="Live view: colour text from accepted draft tokens (cyan)."
        ),
        False,
    ),
    "quiet": (
        _option(
            bool,
            "--quiet",
            "-q",
            help="No live view, status lines or stats: only the answer (or its --json record).",
        ),
        False,
    ),
    "threads": (
        _option(
            int | None,
            "--threads",
            help="CPU threads for torch (default: torch's, one per core; OMP_NUM_THREADS "
            "sets it too).",
        ),
        None,
    ),
    "measure_costs": (
        _option(
            bool,
            "--measure-costs",
            help="Measure the step costs the scheduler decides from again, instead of using "
            "the cached ones (they are also re-measured by themselves when the steps "
            "disagree with them).",
        ),
        False,
    ),
    "debug": (DebugOpt, False),
}


@dataclass(frozen=True)
class Run:
    """The shared options as one command received them (defaults for those it lacks)."""

    model: str = DEFAULT_MODEL
    method: Any = None  # a Method when --method was given
    drafter: list[str] | None = None
    draft_tokens: int | None = None
    block_size: int | None = None
    verify_policy: str = "cost"
    engine: str = "auto"
    cuda_graphs: bool = True
    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    device: str = "auto"
    dtype: str = "auto"
    context: int | None = None
    think: bool | None = None
    show_drafts: bool = False
    quiet: bool = False
    threads: int | None = None
    measure_costs: bool = False
    debug: bool = False

    def spec(self, **overrides: Any) -> SpecConfig:
        """The decoding method these options ask for (`overrides`: a command's own)."""
        method = getattr(self.method, "value", self.method)
        if method == "ar" and self.drafter:
            # An explicit `--method ar` says "no drafter": running the drafter anyway (its
            # kind used to win) would ignore what was typed, so the two are refused together.
            raise SpecgenError(
                "--method ar runs no drafter: drop --drafter, or drop --method to run the "
                "drafter as its own kind"
            )
        settings = dict(
            method=method or "ar",  # "ar" with a drafter: the library reads its kind
            drafter=self.drafter,
            draft_tokens=self.draft_tokens,
            block_size=self.block_size,
            verify_policy=self.verify_policy,
            engine=self.engine,
            cuda_graphs=self.cuda_graphs,
        )
        return SpecConfig(**{**settings, **overrides})

    def sampling(self) -> SamplingParams:
        """Checked before anything slow happens (loading a model)."""
        if self.max_new_tokens < 1:
            raise SpecgenError(f"--max-new-tokens must be at least 1 (got {self.max_new_tokens})")
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed
        )

    def load(self, spec: SpecConfig | None = None) -> Pipeline:
        """The target (and drafter) these options name, reporting slow one-off work."""
        from specgen import display
        from specgen.cli.common import quiet_libraries
        from specgen.pipeline import Pipeline

        quiet_libraries()
        if self.threads is not None:
            if self.threads < 1:
                raise SpecgenError(f"--threads must be at least 1 (got {self.threads})")
            import torch

            torch.set_num_threads(self.threads)
        pipe = Pipeline.load(
            self.model,
            device=self.device,
            dtype=self.dtype,
            context=self.context,
            spec=spec or self.spec(),
            notify=None if self.quiet else display.status,
            measure_costs=self.measure_costs,
        )
        if self.think is not None and pipe.method is not None and pipe.thinking is not None:
            if self.think != pipe.thinking:  # said once, when the pipeline is loaded
                trained = "on" if pipe.thinking else "off"
                display.note(
                    f"note: {pipe.name}'s drafters were trained with thinking {trained}; "
                    f"--{'' if self.think else 'no-'}think will lower their acceptance"
                )
        return pipe


assert set(OPTIONS) == {f.name for f in fields(Run)}


def run_options(
    *names: str, helps: dict[str, str] | None = None, **defaults: Any
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command takes the shared options `names` (with these `defaults` and
    `helps` where its own differ) after its own parameters, and receives them as `run: Run`."""
    helps = helps or {}
    unknown = set(names) - set(OPTIONS) or (set(defaults) | set(helps)) - set(names)
    if unknown:
        raise ValueError(f"not shared options: {sorted(unknown)}")

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.name != "run"
        ]  # fmt: skip
        shared = [
            inspect.Parameter(
                n,
                inspect.Parameter.KEYWORD_ONLY,
                default=defaults.get(n, OPTIONS[n][1]),
                annotation=_with_help(OPTIONS[n][0], helps[n]) if n in helps else OPTIONS[n][0],
            )
            for n in names
        ]

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            run = Run(**{n: kwargs.pop(n) for n in names})
            return command(run=run, **kwargs)

        params = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + shared
        wrapper.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        del wrapper.__wrapped__  # Typer reads the signature above, not the command's
        return wrapper

    return wrap


def _with_help(annotation: Any, help: str) -> Any:
    """A shared option with another help text, for a command where the shared one would be
    wrong (what `--quiet` leaves out differs between commands)."""
    kind, info = get_args(annotation)
    info = copy.copy(info)
    info.help = help
    return Annotated[kind, info]
