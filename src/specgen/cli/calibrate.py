"""`specgen calibrate`: fit per-position temperatures for a DSpark drafter's confidences.

Runs the drafter on the user's prompts with every draft verified whole (so each position
is judged whenever it is reached), records each step's confidence logits and accepted
count, fits the temperatures left to right (`methods/dspark/calibration.py`) and writes
`calibration.json` beside the drafter, where `--method dspark` picks it up.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from specgen.cli.common import user_errors
from specgen.cli.options import Run, run_options
from specgen.core.errors import SpecgenError
from specgen.terminal import display
from specgen.text.prompts import read_prompts


@run_options(
    "model", "drafter", "sampling", "target", "output", "runtime",
    # always DSpark verifying every draft token: no cost to measure, no live view
    without=("show_drafts", "measure_costs"),
    max_new_tokens=128, seed=0,
    helps={
        "drafter": "The DSpark drafter to calibrate (directory or Hub repo; default: the "
        "registry's DSpark drafter for --model).",
        "max_new_tokens": "Most tokens drafted and verified per prompt.",
        "temperature": "Sampling temperature to calibrate at: the one you generate with "
        "(0 = greedy).",
        "quiet": "No progress or status lines: only the table (or the --json object).",
    },
)  # fmt: skip
def calibrate(
    prompts: Annotated[
        list[str],
        typer.Option(
            "--prompts",
            "-f",
            help="Prompt file (.txt one per line, .jsonl with prompt/turns); repeatable.",
        ),
    ],
    num_prompts: Annotated[
        int, typer.Option("--num-prompts", help="Use at most this many prompts (0 = all).")
    ] = 0,
    out: Annotated[
        str | None,
        typer.Option("--out", help="Where to write (default: calibration.json in the drafter)."),
    ] = None,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the fit as one JSON object (temperatures, ECE before/after per "
            "position, drafts, path) instead of the table.",
        ),
    ] = False,
    *,
    run: Run,
) -> None:
    """Fit per-position temperatures for a DSpark drafter's confidence head on your prompts.

    The drafter answers each prompt with every draft verified whole; its confidences are
    then scaled position by position so that they match how often drafts were accepted.
    Prints the calibration error (ECE) per position before and after, and writes
    calibration.json into the drafter's directory (or --out), where generating with that
    drafter picks it up. Calibrate at the --temperature you generate with."""
    with user_errors(run.debug):
        from specgen.hub import resolve_drafter
        from specgen.methods.dspark.calibration import fit_temperatures, save_calibration

        sampling = run.sampling()
        texts = [p.text for path in prompts for p in read_prompts(path)]
        texts = texts[:num_prompts] if num_prompts > 0 else texts
        pipe = run.load(run.spec(method="dspark", verify_policy="full", trace=True))
        pipe.method.uncalibrated(pipe.spec.drafter)  # fit the head's raw logits
        steps = []
        for i, text in enumerate(texts, start=1):
            done = pipe.generate(
                text,
                sampling=sampling,
                max_new_tokens=run.max_new_tokens,
                think=run.think,
                session=pipe.new_session(),
            )
            steps.extend(_steps(done.stats.trace or []))
            if not run.quiet:
                display.status(f"calibrating: {i}/{len(texts)} prompts, {len(steps)} drafts")
        if not steps:
            raise SpecgenError("no drafts were verified; give longer answers or more prompts")
        fit = fit_temperatures(steps)
        extra = {
            "model": pipe.name,
            "drafter": pipe.spec.drafter,
            "prompts": len(texts),
            "drafts": len(steps),
            "temperature": run.temperature,
            "max_new_tokens": run.max_new_tokens,
        }
        where = Path(out) if out else resolve_drafter(pipe.spec.drafter)
        path = save_calibration(where, fit, extra)
        record = {**fit.to_dict(), **extra, "path": str(path)}
        if json_out:
            display.write_json(record)
        else:
            display.show(display.calibration_table(fit))
            if not run.quiet:
                display.status(f"wrote {path}")


def _steps(trace: list[dict]):
    """Calibration samples from a traced answer: the verified part of each draft."""
    from specgen.methods.dspark.calibration import Step

    for record in trace:
        n = record["verify_length"]
        if n and record.get("confidence"):
            conf = [min(max(c, 1e-7), 1 - 1e-7) for c in record["confidence"][:n]]
            yield Step(tuple(math.log(c / (1 - c)) for c in conf), record["accepted"])
