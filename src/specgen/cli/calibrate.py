"""`specgen calibrate`: fit per-position temperatures for a DSpark drafter's confidences.

Runs the drafter on the user's prompts with every draft verified whole (so each position
is judged whenever it is reached), records each step's confidence logits and accepted
count, fits the temperatures left to right (`scheduling/calibration.py`) and writes
`calibration.json` beside the drafter, where `--method dspark` picks it up.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from specgen import display
from specgen.cli.common import load_pipeline, sampling_options, user_errors
from specgen.cli.options import (
    DEFAULT_MODEL,
    ContextOpt,
    DebugOpt,
    DeviceOpt,
    DrafterOpt,
    DtypeOpt,
    JsonOpt,
    MaxNewTokensOpt,
    ModelOpt,
    QuietOpt,
    SeedOpt,
    TemperatureOpt,
    ThinkOpt,
    TopKOpt,
    TopPOpt,
)
from specgen.cli.prompts import read_prompt_file
from specgen.config import SpecConfig
from specgen.errors import SpecgenError


def calibrate(
    prompts: Annotated[
        list[str],
        typer.Option(
            "--prompts",
            "-f",
            help="Prompt file (.txt one per line, .jsonl with prompt/turns); repeatable.",
        ),
    ],
    model: ModelOpt = DEFAULT_MODEL,
    drafter: DrafterOpt = None,
    num_prompts: Annotated[
        int, typer.Option("--num-prompts", help="Use at most this many prompts (0 = all).")
    ] = 0,
    max_new_tokens: MaxNewTokensOpt = 128,
    temperature: TemperatureOpt = 0.0,
    top_p: TopPOpt = 1.0,
    top_k: TopKOpt = 0,
    seed: SeedOpt = 0,
    out: Annotated[
        str | None,
        typer.Option("--out", help="Where to write (default: calibration.json in the drafter)."),
    ] = None,
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "auto",
    context: ContextOpt = None,
    think: ThinkOpt = False,
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Calibrate a DSpark drafter's confidence head on your prompts (ECE before/after)."""
    with user_errors(debug):
        from specgen.hub import resolve_drafter
        from specgen.scheduling.calibration import fit_temperatures, save_calibration

        sampling = sampling_options(max_new_tokens, temperature, top_k, top_p, seed)
        texts = [t for path in prompts for t in read_prompt_file(path)]
        texts = texts[:num_prompts] if num_prompts > 0 else texts
        spec = SpecConfig(method="dspark", drafter=drafter, verify_policy="full", trace=True)
        pipe = load_pipeline(
            model, spec=spec, device=device, dtype=dtype, context=context, quiet=quiet
        )
        if not pipe.method.net.args.confidence:
            raise SpecgenError(f"{pipe.spec.drafter} has no confidence head to calibrate")
        pipe.method.calibration = None  # fit the head's raw logits
        steps = []
        for i, text in enumerate(texts, start=1):
            done = pipe.generate(
                text,
                sampling=sampling,
                max_new_tokens=max_new_tokens,
                think=think,
                session=pipe.new_session(),
            )
            steps.extend(_steps(done.stats.trace or []))
            if not quiet:
                display.status(f"calibrating: {i}/{len(texts)} prompts, {len(steps)} drafts")
        if not steps:
            raise SpecgenError("no drafts were verified; give longer answers or more prompts")
        fit = fit_temperatures(steps)
        extra = {
            "model": pipe.name,
            "drafter": pipe.spec.drafter,
            "prompts": len(texts),
            "drafts": len(steps),
            "temperature": temperature,
            "max_new_tokens": max_new_tokens,
        }
        where = Path(out) if out else resolve_drafter(pipe.spec.drafter)
        path = save_calibration(where, fit, extra)
        record = {**fit.to_dict(), **extra, "path": str(path)}
        if json_out:
            display.write_json(record)
        else:
            display.show(display.calibration_table(fit))
            display.status(f"wrote {path}")


def _steps(trace: list[dict]):
    """Calibration samples from a traced answer: the verified part of each draft."""
    from specgen.scheduling.calibration import Step

    for record in trace:
        n = record["verify_length"]
        if n and record.get("confidence"):
            conf = [min(max(c, 1e-7), 1 - 1e-7) for c in record["confidence"][:n]]
            yield Step(tuple(math.log(c / (1 - c)) for c in conf), record["accepted"])
