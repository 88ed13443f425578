"""`specgen train`: distil a DFlash, DSpark or EAGLE-3 drafter for a target from its own
answers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specgen.cli.common import quiet_libraries, user_errors
from specgen.cli.options import DebugOpt, DequantizeOpt, DeviceOpt, ModelOpt, QuantizeOpt, Run
from specgen.terminal import display
from specgen.terminal.display import plural


def train(
    out: Annotated[Path, typer.Option("--out", help="Directory for the drafter and state.")],
    kind: Annotated[str, typer.Option("--kind", help="dflash, dspark or eagle3.")] = "dflash",
    prompts: Annotated[
        list[Path] | None,
        typer.Option(
            "--prompts",
            help="Prompt files (.jsonl with turns/prompt, or .txt); the target answers them "
            "into OUT/answers.jsonl (resumable) before training.",
        ),
    ] = None,
    data: Annotated[
        list[Path] | None,
        typer.Option("--data", help="Answers already generated (JSONL with prompt/response ids)."),
    ] = None,
    model: ModelOpt = Run.model,
    prompt_tokens: Annotated[
        int, typer.Option("--prompt-tokens", help="Cut each prompt to this many tokens.")
    ] = 128,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", help="Longest answer the target writes per prompt.")
    ] = 160,
    batch: Annotated[int, typer.Option("--batch", help="Prompts answered at once.")] = 32,
    block_size: Annotated[
        int,
        typer.Option(
            "--block-size", help="Positions per drafter pass (drafts: B-1 DFlash, B DSpark)."
        ),
    ] = 8,
    draft_layers: Annotated[
        int, typer.Option("--draft-layers", help="Transformer layers in the drafter.")
    ] = 1,
    target_layers: Annotated[
        str | None, typer.Option("--target-layers", help="Comma-separated tap layers.")
    ] = None,
    minutes: Annotated[
        float | None,
        typer.Option(
            "--minutes", help="Training budget in minutes (with --steps: whichever ends first)."
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option("--steps", help="Training budget in optimiser steps.")
    ] = None,
    lr: Annotated[
        float, typer.Option("--lr", help="Peak learning rate (AdamW; warm-up, then cosine).")
    ] = 1e-3,
    sequences_per_step: Annotated[
        int, typer.Option("--sequences-per-step", help="Answers in each optimiser step.")
    ] = 4,
    anchors_per_sequence: Annotated[
        int, typer.Option("--anchors-per-sequence", help="Blocks drawn from each answer.")
    ] = 16,
    mask_token_id: Annotated[
        int,
        typer.Option(
            "--mask-token-id", help="Token id of the block's MASK positions (a target token id)."
        ),
    ] = 0,
    markov_rank: Annotated[
        int, typer.Option("--markov-rank", help="DSpark: rank of the Markov head's bias.")
    ] = 64,
    init: Annotated[
        str,
        typer.Option(
            "--init",
            help="random, target (copy the target's upper layers), or a trained drafter's "
            "directory to train further (same shape; a fresh optimiser and schedule).",
        ),
    ] = "random",
    full_vocab: Annotated[
        bool, typer.Option("--full-vocab", help="Train through the whole LM head.")
    ] = False,
    draft_vocab: Annotated[
        int | None,
        typer.Option(
            "--draft-vocab",
            help="Draft from the N tokens most frequent in the answers (default: every token "
            "they use); a smaller head drafts faster and never drafts the rest.",
        ),
    ] = None,
    session_minutes: Annotated[
        float | None,
        typer.Option(
            "--session-minutes",
            help="Stop this process after N minutes, state saved and drafter written, without "
            "ending the run: --resume carries it on (a long run, one session at a time).",
        ),
    ] = None,
    train_sequences: Annotated[
        int | None,
        typer.Option("--train-sequences", help="Train on the first N answers only."),
    ] = None,
    eval_minutes: Annotated[
        float, typer.Option("--eval-minutes", help="Offline τ on held-out answers this often.")
    ] = 3.0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue from OUT/state.safetensors.")
    ] = False,
    device: DeviceOpt = Run.device,
    quantize: QuantizeOpt = None,
    dequantize: DequantizeOpt = False,
    debug: DebugOpt = Run.debug,
) -> None:
    """Train a drafter (time- or step-bounded, resumable) and write it in its public format.

    With --prompts and no budget, only the answers are generated. The loss reported every
    10 steps is the mean of those 10 steps; the final one, the mean of the last 20."""
    with user_errors(debug):
        quiet_libraries()
        import torch

        from specgen.api.loader import load_weights
        from specgen.cli.train_answers import answer_training_prompts
        from specgen.core.device import resolve_device
        from specgen.core.errors import SpecgenError
        from specgen.core.paths import specgen_home
        from specgen.hub import resolve_model
        from specgen.methods import registered
        from specgen.models.loading import read_config
        from specgen.training.kind import training_of
        from specgen.training.loop import TrainConfig, load_sequences
        from specgen.training.loop import train as run

        registered()  # every method's training hooks
        if not training_of(kind).warm_starts and init != "random":
            raise SpecgenError(f"--kind {kind} starts from random weights only (got --init {init})")
        if init not in ("target", "random") and not (Path(init) / "config.json").is_file():
            raise SpecgenError(
                f"--init must be random, target or a drafter directory (got {init!r})"
            )
        if draft_vocab is not None and (draft_vocab < 1 or full_vocab):
            raise SpecgenError("--draft-vocab must be >= 1 (and not with --full-vocab)")
        if session_minutes is not None and session_minutes < 0:
            raise SpecgenError(f"--session-minutes must be >= 0 (got {session_minutes})")
        if sequences_per_step < 1 or anchors_per_sequence < 1:
            raise SpecgenError("--sequences-per-step and --anchors-per-sequence must be >= 1")
        if not prompts and not data:
            raise SpecgenError("give --prompts FILE (the target answers them) or --data FILE")
        if not prompts and not minutes and not steps:
            raise SpecgenError("give a budget: --minutes N or --steps N")
        for path in data or []:
            if not path.is_file():
                raise SpecgenError(f"{path}: no such data file")
        layers = tuple(int(x) for x in target_layers.split(",")) if target_layers else ()
        resolved = resolve_model(model, notify=display.status)
        dev = resolve_device(device)
        files = list(data or [])
        if prompts:
            files.append(
                answer_training_prompts(
                    model,
                    resolved,
                    dev,
                    prompts,
                    out,
                    prompt_tokens,
                    max_new_tokens,
                    batch,
                    dict(quantize=quantize, dequantize=dequantize),
                )
            )
            if not minutes and not steps:
                return
        target = load_weights(
            resolved, torch.float32, dev, quantize=quantize, dequantize=dequantize
        )
        sequences = [seq for path in files for seq in load_sequences(path)]
        if not sequences:
            raise SpecgenError("no answers to train on")
        display.status(f"{len(sequences)} sequences, {sum(len(s.ids) for s in sequences)} tokens")
        cfg = TrainConfig(
            kind=kind,
            block_size=block_size,
            draft_layers=draft_layers,
            target_layers=layers,
            mask_token_id=mask_token_id,
            markov_rank=markov_rank,
            lr=lr,
            sequences_per_step=sequences_per_step,
            anchors_per_sequence=anchors_per_sequence,
            minutes=minutes,
            steps=steps,
            init_from_target=init == "target",
            init_from=init if init not in ("target", "random") else None,
            restrict_vocab=not full_vocab,
            draft_vocab=draft_vocab,
            session_minutes=session_minutes,
            eval_minutes=eval_minutes,
            train_sequences=train_sequences,
        )

        def report(row: dict) -> None:
            if "eval" in row:
                display.status(
                    f"step {row['eval']} · held-out τ {row['tau']:.3f} · {row['minutes']:.1f} min"
                )
                return
            if "prepared" in row:
                display.status(f"target features: {row['prepared']}/{row['of']} sequences")
                return
            display.status(
                f"step {row['step']} · loss {row['loss']:.3f} (mean of the last 10 steps) · "
                f"{row['seconds'] / 60:.1f} min"
            )

        config = read_config(resolved.path, resolved.name)
        summary = run(
            target, config, sequences, cfg, out, target_name=resolved.name,
            features_cache=specgen_home() / "features", resume=resume, report=report,
        )  # fmt: skip
        tau, last = summary["offline_tau"], min(summary["steps"], 20)  # as training/loop.py
        more = "" if summary["finished"] else " so far; --resume carries it on"
        display.status(
            f"wrote {out} ({summary['steps']} steps{more}, loss {summary['final_loss']} "
            f"(mean of the last {plural(last, 'step')})"
            + (f", held-out τ {tau:.3f})" if tau is not None else ")")
        )
