"""Options shared by the commands, each declared once (DESIGN.md §5).

`Run` is the table: one field per shared option with its flag, help and group beside it,
its default read from the library's own types (`SamplingParams`, `SpecConfig`, ...), so
the CLI cannot drift from what the library does when an option is left out.

`@run_options("model", "sampling", ...)` gives a command the groups it takes (or a single
option of one), with its own defaults and helps where they differ, after its own
parameters, and hands them to it as one `Run`, which builds the `SpecConfig`, the
`SamplingParams` and the loaded pipeline the same way for every command.
"""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_type_hints

import typer

from specgen.core.config import (
    AR,
    DEFAULT_MAX_NEW_TOKENS,
    SamplingParams,
    SpecConfig,
    VerifyPolicy,
    checked_max_new_tokens,
)
from specgen.core.errors import SpecgenError
from specgen.methods import METHODS
from specgen.registry import DEFAULT_ALIAS

if TYPE_CHECKING:
    from specgen.api.pipeline import Pipeline

DEFAULT_MODEL = DEFAULT_ALIAS

# Only methods that work are offered: plain AR plus every registered drafter.
Method = Enum("Method", {name: name for name in METHODS}, type=str)


def _shared(group: str, default: Any, *decls: str, help: str) -> Any:
    """A `Run` field that is also a command-line option of `group`."""
    return field(default=default, metadata={"group": group, "option": (decls, help)})


@dataclass(frozen=True)
class Run:
    """The shared options as one command received them (defaults for those it lacks).

    Fields are in the order commands list them in their help; groups are runs of them."""

    model: str = _shared(
        "model",
        DEFAULT_MODEL,
        "--model",
        "-m",
        help="Alias (see `specgen models`), local directory, .gguf file or Hub repo.",
    )
    # -- method: what drafts. None = not given: plain decoding, or the --drafter's kind
    method: Method | None = _shared(
        "method",
        None,
        "--method",
        help="Decoding method (ar = no speculation). Default: ar, or the kind of the "
        "--drafter given.",
    )
    drafter: list[str] | None = _shared(
        "method",
        None,
        "--drafter",
        help="Drafter checkpoint (directory or Hub repo) instead of the registry's; its kind "
        "sets --method when that is not given. Give two or more (any mix of DFlash, DSpark, "
        "DFlash 2, EAGLE-3) for stacked.",
    )
    draft_model: str | None = _shared(
        "method",
        None,
        "--draft-model",
        help="A smaller model of the target's tokenizer to draft with (alias, directory, "
        ".gguf file or Hub repo): --method draft, or one of stacked's drafters.",
    )
    draft_tokens: int | None = _shared(
        "method",
        SpecConfig.draft_tokens,
        "--draft-tokens",
        "-k",
        help="Most tokens drafted per step (default: per method).",
    )
    block_size: int | None = _shared(
        "method",
        SpecConfig.block_size,
        "--block-size",
        help="Run a block drafter at a smaller block than trained.",
    )
    store_mib: float | None = _shared(
        "method",
        SpecConfig.store_mib,
        "--store-mib",
        help="Memory (MiB) suffix keeps of this process's earlier answers to draft from, "
        "the oldest forgotten first (default: 64; 0: only the request itself).",
    )
    # -- engine: how each step is verified and run
    verify_policy: str = _shared(
        "engine",
        str(VerifyPolicy()),
        "--verify-policy",
        help="How many draft tokens each step verifies: cost (best expected tokens/s from "
        "confidences and measured costs), full, or threshold=X (while each token's "
        "acceptance estimate is >= X).",
    )
    engine: str = _shared(
        "engine",
        SpecConfig.engine,
        "--engine",
        help="auto (overlap on CUDA, sync on the CPU), overlap (decode in a thread of its "
        "own, ahead of printing; on CUDA each speculative step is queued before the last "
        "one's result is read) or sync (the plain loop).",
    )
    cuda_graphs: bool = _shared(
        "engine",
        SpecConfig.cuda_graphs,
        "--cuda-graphs/--no-cuda-graphs",
        help="On CUDA, replay decode and verify steps as CUDA graphs (off: eager).",
    )
    # -- sampling: the answer's length and how its tokens are chosen
    max_new_tokens: int = _shared(
        "sampling",
        DEFAULT_MAX_NEW_TOKENS,
        "--max-new-tokens",
        "-n",
        help="Most tokens to generate per answer.",
    )
    temperature: float = _shared(
        "sampling",
        SamplingParams.temperature,
        "--temperature",
        "-t",
        help="0 = greedy; > 0 samples.",
    )
    top_p: float = _shared(
        "sampling", SamplingParams.top_p, "--top-p", help="Nucleus sampling mass (1 = off)."
    )
    top_k: int = _shared(
        "sampling", SamplingParams.top_k, "--top-k", help="Sample among the k likeliest (0 = off)."
    )
    seed: int | None = _shared(
        "sampling", SamplingParams.seed, "--seed", help="Seed for sampling (reproducible runs)."
    )
    presence_penalty: float = _shared(
        "sampling",
        SamplingParams.presence_penalty,
        "--presence-penalty",
        help="Subtract this from the logit of every token already in the answer (OpenAI's; "
        "-2 to 2, 0 = off).",
    )
    frequency_penalty: float = _shared(
        "sampling",
        SamplingParams.frequency_penalty,
        "--frequency-penalty",
        help="Subtract this once per time a token is already in the answer (OpenAI's; "
        "-2 to 2, 0 = off).",
    )
    repetition_penalty: float = _shared(
        "sampling",
        SamplingParams.repetition_penalty,
        "--repetition-penalty",
        help="Divide positive logits (multiply negative ones) of tokens in the prompt or "
        "the answer by this (vLLM's and transformers'; 1 = off).",
    )
    # -- target: where the target runs and how it is prompted ("auto": Pipeline.load's)
    device: str = _shared("target", "auto", "--device", help="auto, cpu or cuda[:N].")
    dtype: str = _shared(
        "target",
        "auto",
        "--dtype",
        help="auto (bf16 on GPU, fp32 on CPU), float32, bfloat16 or float16.",
    )
    quantize: str | None = _shared(
        "target",
        None,
        "--quantize",
        help="Pack a full-precision target's matrices on load: int8 or int4 (group-wise; "
        "not for GGUF files, which run packed in their own quantization).",
    )
    dequantize: bool = _shared(
        "target",
        False,
        "--dequantize",
        help="Run a GGUF target dequantized to --dtype instead of packed (the old "
        "behaviour; the oracle packed weights are tested against).",
    )
    context: int | None = _shared(
        "target",
        None,
        "--context",
        help="KV-cache size in tokens (default: min(model limit, 8192)).",
    )
    think: bool | None = _shared(
        "target",
        None,
        "--think/--no-think",
        help="The chat template's thinking mode (Qwen3, Qwen3.5). Default: what the "
        "model's drafters were trained with (`specgen models`: off for Qwen3, on for "
        "Qwen3.5); the other mode lowers acceptance.",
    )
    # -- output: what the terminal shows
    show_drafts: bool = _shared(
        "output",
        False,
        "--show-drafts",
        help="Live view: colour text from accepted draft tokens (cyan).",
    )
    quiet: bool = _shared(
        "output",
        False,
        "--quiet",
        "-q",
        help="No live view, status lines or stats: only the answer (or its --json record).",
    )
    # -- runtime: the process around the run
    threads: int | None = _shared(
        "runtime",
        None,
        "--threads",
        help="CPU threads for torch (default: torch's, one per core; OMP_NUM_THREADS sets it too).",
    )
    measure_costs: bool = _shared(
        "runtime",
        False,
        "--measure-costs",
        help="Measure the step costs the scheduler decides from again, instead of using "
        "the cached ones (they are also re-measured by themselves when the steps "
        "disagree with them).",
    )
    debug: bool = _shared("runtime", False, "--debug", help="Show tracebacks for errors.")

    def spec(self, **overrides: Any) -> SpecConfig:
        """The decoding method these options ask for (`overrides`: a command's own)."""
        method = getattr(self.method, "value", self.method)
        drafter = self.drafter
        if self.draft_model is not None:
            from specgen.methods.draft import with_draft_model

            method, drafter = with_draft_model(method, drafter, self.draft_model)
        if method == AR and self.drafter:
            # An explicit `--method ar` says "no drafter": running the drafter anyway (its
            # kind used to win) would ignore what was typed, so the two are refused together.
            raise SpecgenError(
                "--method ar runs no drafter: drop --drafter, or drop --method to run the "
                "drafter as its own kind"
            )
        settings = dict(
            method=method or AR,  # AR with a drafter: the library reads its kind
            drafter=drafter,
            draft_tokens=self.draft_tokens,
            block_size=self.block_size,
            store_mib=self.store_mib,
            verify_policy=self.verify_policy,
            engine=self.engine,
            cuda_graphs=self.cuda_graphs,
        )
        return SpecConfig(**{**settings, **overrides})

    @property
    def drafters(self) -> list[str]:
        """Every drafter given: --drafter's, then --draft-model."""
        return [*(self.drafter or []), *([self.draft_model] if self.draft_model else [])]

    def sampling(self) -> SamplingParams:
        """Checked before anything slow happens (loading a model)."""
        checked_max_new_tokens(self.max_new_tokens)
        return SamplingParams(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, seed=self.seed,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
        )  # fmt: skip

    def load(self, spec: SpecConfig | None = None, *, quick: bool = False) -> Pipeline:
        """The target (and drafter) these options name, reporting slow one-off work (and,
        with --debug, where the load's time went). `quick`: a greedy AR answer may come
        from the fast start (api/quick.py) when an image of the model is there; a full
        load that could have used one writes it."""
        import time

        from specgen.cli import fast_start
        from specgen.cli.common import quiet_libraries
        from specgen.core import once, timings
        from specgen.terminal import display

        start = time.perf_counter()
        quiet_libraries()
        notify = None if self.quiet else display.status
        once.listen(notify)  # what a first run builds
        spec = spec or self.spec()
        quick = quick and fast_start.wanted(self, spec)
        with timings.recording() as phases:
            resolved = None
            if quick or Path(self.model).expanduser().exists():  # a local file: read first
                from specgen.hub import resolve_model

                with timings.phase("file checked"):
                    resolved = resolve_model(self.model, notify=notify)
            if quick and resolved is not None and resolved.gguf is not None:
                fast = fast_start.opened(self, resolved)
                if fast is not None:
                    if self.debug:
                        display.status(timings.report(phases, time.perf_counter() - start))
                    return fast  # type: ignore[return-value]  (Pipeline's part generate uses)
            with timings.phase("imports"):  # torch and the engine: the first thing that needs them
                from specgen.api.pipeline import Pipeline
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
                quantize=self.quantize,
                dequantize=self.dequantize,
                spec=spec,
                notify=notify,
                measure_costs=self.measure_costs,
            )
        if quick and resolved is not None and resolved.gguf is not None:
            fast_start.write(pipe, resolved.gguf)
        if self.debug:
            display.status(timings.report(phases, time.perf_counter() - start))
        if self.think is not None and pipe.method is not None and pipe.thinking is not None:
            if self.think != pipe.thinking:  # said once, when the pipeline is loaded
                trained = "on" if pipe.thinking else "off"
                display.note(
                    f"note: {pipe.name}'s drafters were trained with thinking {trained}; "
                    f"--{'' if self.think else 'no-'}think will lower their acceptance"
                )
        return pipe


def _options() -> dict[str, Any]:
    """Each shared option's Typer annotation, read from `Run`'s fields."""
    kinds = get_type_hints(Run)
    options = {}
    for f in fields(Run):
        decls, help = f.metadata["option"]
        options[f.name] = Annotated[kinds[f.name], typer.Option(*decls, help=help)]
    return options


def _groups() -> dict[str, tuple[str, ...]]:
    groups: dict[str, tuple[str, ...]] = {}
    for f in fields(Run):
        groups[f.metadata["group"]] = (*groups.get(f.metadata["group"], ()), f.name)
    return groups


OPTIONS = _options()  # name -> Annotated[type, typer.Option(...)]
DEFAULTS = {f.name: f.default for f in fields(Run)}
GROUPS = _groups()  # group -> its options, in `Run`'s order

# For commands that take a shared option without a `Run` (export, train, models).
ModelOpt, DeviceOpt, DebugOpt = OPTIONS["model"], OPTIONS["device"], OPTIONS["debug"]
QuantizeOpt, DequantizeOpt = OPTIONS["quantize"], OPTIONS["dequantize"]
JsonOpt = Annotated[
    bool,
    typer.Option("--json", help="One JSON object per prompt: prompt, text, token_ids, stats."),
]


def shared_names(picks: tuple[str, ...], without: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The options `picks` (groups, or single options of a group) name, less `without`, in
    the order picked: a command's help lists them so."""
    names: list[str] = []
    for pick in picks:
        if pick not in GROUPS and pick not in OPTIONS:
            raise ValueError(f"not a group or shared option: {pick!r}")
        names += GROUPS.get(pick, (pick,))
    if len(set(names)) != len(names) or set(without) - set(names):
        raise ValueError(f"picked twice, or left out unpicked: {picks} without {without}")
    return tuple(n for n in names if n not in without)


def run_options(
    *picks: str,
    without: tuple[str, ...] = (),
    helps: dict[str, str] | None = None,
    **defaults: Any,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator: the command takes the shared options of `picks` (groups, see `GROUPS`, or
    single options), less `without`, with these `defaults` and `helps` where its own differ,
    after its own parameters, and receives them as `run: Run`."""
    names = shared_names(picks, without)
    helps = helps or {}
    unknown = (set(defaults) | set(helps)) - set(names)
    if unknown:
        raise ValueError(f"not options of this command: {sorted(unknown)}")

    def wrap(command: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p for p in inspect.signature(command, eval_str=True).parameters.values()
            if p.name != "run"
        ]  # fmt: skip
        shared = [
            inspect.Parameter(
                n,
                inspect.Parameter.KEYWORD_ONLY,
                default=defaults.get(n, DEFAULTS[n]),
                annotation=_with_help(OPTIONS[n], helps[n]) if n in helps else OPTIONS[n],
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
