"""The training loop: a new drafter for a target, AdamW with warm-up + cosine decay,
clipping, periodic resumable checkpoints, and the final drafter in its public format.

The loop is time- or step-bounded (`minutes` / `steps`); the learning-rate schedule runs
over that budget. `state.safetensors` in the output directory (`training/state.py`)
holds weights, optimiser, step, elapsed time and RNG state; `resume` continues from it
(the budget then counts the time already spent). `session_minutes` ends one process's
share of a long run early, its state saved and its drafter written (marked unfinished), so
a run of many hours can go on one working session at a time (scripts/long_train.sh); with
a step budget the sessions together take the uninterrupted run's steps, bit for bit.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specgen.core.errors import CheckpointError
from specgen.drafting.base import method_of
from specgen.models.transformer import Transformer
from specgen.training.features import target_features
from specgen.training.kind import DrafterTraining, training_of
from specgen.training.state import FILE as STATE_FILE
from specgen.training.state import load_state, save_state
from specgen.training.trainer import Prepared, Sequence, Vocab, read_layers


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "dflash"  # a trainable method's name (training/kind.py)
    block_size: int = 8
    draft_layers: int = 1
    target_layers: tuple[int, ...] = ()  # () = spread over the target (z-lab's rule)
    mask_token_id: int = 0
    markov_rank: int = 64
    lr: float = 1e-3
    warmup: int = 50
    minutes: float | None = None
    steps: int | None = None
    sequences_per_step: int = 4
    anchors_per_sequence: int = 16
    gamma: float = 4.0  # slot (EAGLE-3: chain step) weights exp(-k / gamma)
    clip: float = 1.0
    checkpoint_every: int = 200
    seed: int = 0
    init_from_target: bool = False  # start from the target's layers (training/init.py)
    init_from: str | None = None  # start from a trained drafter's weights (a directory)
    restrict_vocab: bool = True  # train through the head rows the data uses (trainer.Vocab)
    draft_vocab: int | None = None  # ... only the most frequent this many of them (None: all)
    session_minutes: float | None = None  # this process's share of the run (None: all of it)
    eval_minutes: float = 3.0  # offline τ on the held-out answers this often
    holdout_every: int = 65  # every 65th answer is kept out of training for the offline τ
    train_sequences: int | None = None  # train on the first N answers only (data studies)


def warm_start(kind: DrafterTraining, name: str, net, target: Transformer, path: Path) -> None:
    """Load a trained drafter's weights (its public format) into `net`, which must have its
    shape: training then goes on from that drafter with a fresh optimiser and schedule."""
    if method_of(path) != name:
        raise CheckpointError(f"{path}: a {method_of(path)} drafter cannot start a {name} one")
    theirs, ours = kind.load(path, target).state_dict(), net.state_dict()
    wrong = sorted(k for k in ours if k not in theirs or theirs[k].shape != ours[k].shape)
    if wrong:
        raise CheckpointError(
            f"{path}: its shape differs from the drafter being trained ({', '.join(wrong[:3])});"
            " give the same --block-size, --draft-layers, --target-layers and --markov-rank"
        )
    net.load_state_dict(theirs)


def lr_at(step: int, progress: float, cfg: TrainConfig) -> float:
    """Linear warm-up over `warmup` steps, then cosine to 10% over the budget."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def split_holdout(data: list[Sequence], every: int) -> tuple[list[Sequence], list[Sequence]]:
    """(train, held out): every `every`-th answer is held out, so every source is
    represented. A stride, not a count: answers appended to a file never move an earlier
    answer across the split, so a drafter trained further on more answers (`init_from`) is
    still judged on answers it never saw."""
    if every <= 1 or len(data) < 4 * every:
        return data, []
    held = set(range(every - 1, len(data), every))
    return [s for i, s in enumerate(data) if i not in held], [data[i] for i in sorted(held)]


def prepare_all(
    target: Transformer,
    kind: DrafterTraining,
    net: torch.nn.Module,
    data: list[Sequence],
    target_name: str,
    cache: Path,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> list[Prepared]:
    """`data` with the target's states at the layers `net` reads (`kind.reads`), from the
    features cache, on the target's device once: a GPU step then copies nothing from the
    host (and indexes last-layer states with device-side positions)."""
    taps, last = kind.reads(net, target)
    hidden = target_features(target, target_name, data, read_layers(taps, last), cache, report)
    return [
        Prepared.from_layers(seq, h, taps, last).to(target.device)
        for seq, h in zip(data, hidden, strict=True)
    ]


def train(
    target: Transformer,
    target_config: dict[str, Any],
    data: list[Sequence],
    cfg: TrainConfig,
    out: Path,
    *,
    target_name: str = "target",
    features_cache: Path | None = None,
    resume: bool = False,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Train a drafter on `data` and write it to `out`; returns the run's summary.

    `features_cache` keeps the target's hidden states across runs (default: `out/features`).
    """
    if not cfg.minutes and not cfg.steps:
        raise ValueError("give a budget: minutes or steps")
    train_seqs, held_seqs = split_holdout(data, cfg.holdout_every)
    train_seqs = train_seqs[: cfg.train_sequences]
    state_path = out / STATE_FILE
    state = load_state(state_path) if resume and state_path.is_file() else None
    vocab = Vocab.of(target, train_seqs, cfg.draft_vocab) if cfg.restrict_vocab else None
    if vocab is not None and state is not None and state["vocab"] is not None:
        # the rows the run started with, though more answers came since: a head sized by
        # them (EAGLE-3's) must keep its rows, and the others keep their meaning
        vocab = Vocab.of_ids(target, state["vocab"])
    kind = training_of(cfg.kind)
    config = kind.config(target_config, target.args.num_layers, cfg, vocab)
    net = kind.new(target, config, cfg, vocab)
    if cfg.init_from and state is None:
        warm_start(kind, cfg.kind, net, target, Path(cfg.init_from))
    vocab_ids = None if vocab is None else vocab.ids.tolist()
    params = kind.trainable(net)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, spent, rng = 0, 0.0, random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    curve: list[list[float]] = []  # [minutes, step, offline τ, loss]
    if state is not None:
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step, spent = state["step"], state["seconds"]
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        curve = state.get("curve", [])
    out.mkdir(parents=True, exist_ok=True)
    used = [s for s in data if id(s) in {id(t) for t in (*train_seqs, *held_seqs)}]
    prepared_all = prepare_all(
        target, kind, net, used, target_name, features_cache or out / "features", report
    )
    train_ids, held_ids = {id(s) for s in train_seqs}, {id(s) for s in held_seqs}
    prepared = [p for p in prepared_all if id(p.seq) in train_ids]
    held = [p for p in prepared_all if id(p.seq) in held_ids]

    def evaluate(loss: float) -> None:
        if not held:
            return
        result = kind.evaluate(target, net, held, vocab)
        minutes = (time.perf_counter() - start) / 60
        curve.append([round(minutes, 2), step, round(result.tau, 4), round(loss, 4)])
        if report:
            report({"eval": step, "tau": result.tau, "minutes": minutes})

    session = time.perf_counter()
    start = session - spent
    next_eval = (len(curve) and curve[-1][0] + cfg.eval_minutes) or 0.0
    history: list[float] = []
    while True:
        elapsed = time.perf_counter() - start
        progress = _progress(step, elapsed, cfg)
        if progress >= 1.0:
            break
        if elapsed / 60 >= next_eval and cfg.eval_minutes > 0:
            evaluate(sum(history[-20:]) / max(len(history[-20:]), 1))
            next_eval = elapsed / 60 + cfg.eval_minutes
        for group in opt.param_groups:
            group["lr"] = lr_at(step, progress, cfg)
        opt.zero_grad()
        total, used = 0.0, 0
        for seq in rng.sample(prepared, min(cfg.sequences_per_step, len(prepared))):
            result = kind.loss(
                target, net, seq, anchors_per_sequence=cfg.anchors_per_sequence,
                gamma=cfg.gamma, generator=gen, vocab=vocab,
            )  # fmt: skip
            if result is None:
                continue
            loss, _ = result
            (loss / cfg.sequences_per_step).backward()
            total += loss.item()
            used += 1
        torch.nn.utils.clip_grad_norm_(params, cfg.clip)
        opt.step()
        step += 1
        history.append(total / max(used, 1))
        if report and step % 10 == 0:
            report({"step": step, "loss": sum(history[-10:]) / 10, "seconds": elapsed})
        if step % cfg.checkpoint_every == 0:
            save_state(state_path, net, opt, step, time.perf_counter() - start, rng, gen, curve,
                       vocab_ids)  # fmt: skip
            # and the drafter itself: a run stopped at an outer limit still leaves one
            kind.write(out, net, config, vocab, {"steps": step, "finished": False})
        if cfg.session_minutes is not None and (
            time.perf_counter() - session >= cfg.session_minutes * 60
        ):
            break  # this session's share is spent; the run goes on with `resume`
    final_loss = sum(history[-20:]) / max(len(history[-20:]), 1)
    evaluate(final_loss)
    seconds = time.perf_counter() - start
    save_state(state_path, net, opt, step, seconds, rng, gen, curve, vocab_ids)
    finished = _progress(step, time.perf_counter() - start, cfg) >= 1.0
    summary = {
        "config": asdict(cfg),
        "steps": step,
        "finished": finished,
        "seconds": round(seconds, 1),
        "sequences": len(train_seqs),
        "held_out": len(held),
        "tokens": sum(len(s.ids) for s in train_seqs),
        "vocab_rows": None if vocab is None else int(vocab.ids.shape[0]),
        "final_loss": round(final_loss, 4),
        "offline_tau": curve[-1][2] if curve else None,
        "curve": [dict(zip(("minutes", "step", "tau", "loss"), row, strict=True)) for row in curve],
    }
    kind.write(out, net, config, vocab, {k: v for k, v in summary.items() if k != "curve"})
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _progress(step: int, elapsed: float, cfg: TrainConfig) -> float:
    """How much of the budget is spent (1: all of it), by time or steps."""
    return max(
        elapsed / (cfg.minutes * 60) if cfg.minutes else 0.0,
        step / cfg.steps if cfg.steps else 0.0,
    )


def load_sequences(path: Path) -> list[Sequence]:
    """Training sequences from an answers file (`specgen train --prompts`)."""
    from specgen.training.generate import read_answers

    out = []
    for row in read_answers(path):
        prompt, response = row["prompt_ids"], row["response_ids"]
        if response:
            out.append(Sequence(prompt + response, len(prompt)))
    return out
