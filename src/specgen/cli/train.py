"""`specgen train`: distil a DFlash or DSpark drafter for a target from its own answers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from specgen import display
from specgen.cli.common import quiet_libraries, user_errors
from specgen.cli.options import DEFAULT_MODEL, DebugOpt, DeviceOpt, ModelOpt


def train(
    kind: Annotated[str, typer.Option("--kind", help="dflash or dspark.")],
    data: Annotated[
        Path,
        typer.Option("--data", help="The target's answers (scripts/seed_training_responses.py)."),
    ],
    out: Annotated[Path, typer.Option("--out", help="Directory for the drafter and state.")],
    model: ModelOpt = DEFAULT_MODEL,
    block_size: Annotated[int, typer.Option("--block-size")] = 8,
    draft_layers: Annotated[int, typer.Option("--draft-layers")] = 1,
    target_layers: Annotated[
        str | None, typer.Option("--target-layers", help="Comma-separated tap layers.")
    ] = None,
    minutes: Annotated[float | None, typer.Option("--minutes")] = None,
    steps: Annotated[int | None, typer.Option("--steps")] = None,
    lr: Annotated[float, typer.Option("--lr")] = 1e-3,
    mask_token_id: Annotated[int, typer.Option("--mask-token-id")] = 0,
    markov_rank: Annotated[int, typer.Option("--markov-rank")] = 64,
    init: Annotated[
        str, typer.Option("--init", help="target (copy the target's upper layers) or random.")
    ] = "target",
    full_vocab: Annotated[
        bool, typer.Option("--full-vocab", help="Train through the whole LM head.")
    ] = False,
    eval_minutes: Annotated[
        float, typer.Option("--eval-minutes", help="Offline τ on held-out answers this often.")
    ] = 3.0,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from DIR/state.pt.")] = False,
    device: DeviceOpt = "auto",
    debug: DebugOpt = False,
) -> None:
    """Train a drafter (time- or step-bounded, resumable) and write it in its public format."""
    with user_errors(debug):
        quiet_libraries()
        import torch

        from specgen.errors import SpecgenError
        from specgen.hub import resolve_model
        from specgen.models.loading import load_target, read_config
        from specgen.paths import specgen_home
        from specgen.pipeline import resolve_device
        from specgen.training.loop import TrainConfig, load_sequences
        from specgen.training.loop import train as run

        if kind not in ("dflash", "dspark"):
            raise SpecgenError(f"--kind must be dflash or dspark (got {kind!r})")
        if init not in ("target", "random"):
            raise SpecgenError(f"--init must be target or random (got {init!r})")
        if not minutes and not steps:
            raise SpecgenError("give a budget: --minutes N or --steps N")
        if not data.is_file():
            raise SpecgenError(f"{data}: no such data file")
        layers = tuple(int(x) for x in target_layers.split(",")) if target_layers else ()
        resolved = resolve_model(model, notify=display.status)
        target = load_target(
            resolved.path, dtype=torch.float32, device=resolve_device(device), name=resolved.name
        )
        sequences = load_sequences(data)
        display.status(f"{len(sequences)} sequences, {sum(len(s.ids) for s in sequences)} tokens")
        cfg = TrainConfig(
            kind=kind,
            block_size=block_size,
            draft_layers=draft_layers,
            target_layers=layers,
            mask_token_id=mask_token_id,
            markov_rank=markov_rank,
            lr=lr,
            minutes=minutes,
            steps=steps,
            init_from_target=init == "target",
            restrict_vocab=not full_vocab,
            eval_minutes=eval_minutes,
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
                f"step {row['step']} · loss {row['loss']:.3f} · {row['seconds'] / 60:.1f} min"
            )

        config = read_config(resolved.path, resolved.name)
        summary = run(
            target, config, sequences, cfg, out, target_name=resolved.name,
            features_cache=specgen_home() / "features", resume=resume, report=report,
        )  # fmt: skip
        tau = summary["offline_tau"]
        display.status(
            f"wrote {out} ({summary['steps']} steps, loss {summary['final_loss']}"
            + (f", held-out τ {tau:.3f})" if tau is not None else ")")
        )
