"""The training loop: a new drafter for a target, AdamW with warm-up + cosine decay,
clipping, periodic resumable checkpoints, and the final drafter in its public format.

The loop is time- or step-bounded (`minutes` / `steps`); the learning-rate schedule runs
over that budget. `state.safetensors` in the output directory (`training/state.py`)
holds weights, optimiser, step, elapsed time and RNG state; `resume` continues from it
(the budget then counts the time already spent).
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

from specgen.drafting.vocab import save_draft_vocab
from specgen.models.drafters.dflash import DFlashArgs, DFlashNet
from specgen.models.drafters.dspark import DSparkArgs, DSparkNet
from specgen.models.drafters.eagle3 import Eagle3Net
from specgen.models.transformer import Transformer
from specgen.training.checkpoint import save_drafter, text_config
from specgen.training.eagle3 import accepted_lengths as eagle3_accepted
from specgen.training.eagle3 import (
    default_taps,
    eagle3_config,
    eagle3_loss,
    new_eagle3,
    save_eagle3,
)
from specgen.training.eagle3 import trainable as eagle3_trainable
from specgen.training.evaluate import offline_acceptance, walk
from specgen.training.features import target_features
from specgen.training.init import init_from_target, random_init
from specgen.training.state import FILE as STATE_FILE
from specgen.training.state import load_state, save_state
from specgen.training.trainer import (
    Prepared,
    Sequence,
    Vocab,
    read_layers,
    sequence_loss,
    trainable,
)


@dataclass(frozen=True)
class TrainConfig:
    kind: str = "dflash"  # or "dspark", "eagle3" (training/eagle3.py)
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
    eval_minutes: float = 3.0  # offline τ on the held-out answers this often
    holdout_every: int = 65  # every 65th answer is kept out of training for the offline τ
    train_sequences: int | None = None  # train on the first N answers only (data studies)


def drafter_config(target_config: dict[str, Any], target_layers: int, cfg: TrainConfig) -> dict:
    """A drafter config.json for the target, in the layout `cfg.kind` is published in."""
    from specgen.models.drafters.dflash import build_target_layer_ids

    ids = list(cfg.target_layers) or build_target_layer_ids(target_layers, 3)
    out = {
        **text_config(target_config),
        "model_type": "qwen3",
        "num_hidden_layers": cfg.draft_layers,
        "layer_types": ["full_attention"] * cfg.draft_layers,
        "block_size": cfg.block_size,
        "num_target_layers": target_layers,
        "mask_token_id": cfg.mask_token_id,
        "target_layer_ids": ids,
        "tie_word_embeddings": False,
    }
    if cfg.kind == "dspark":
        out.update(
            num_anchors=512,
            markov_rank=cfg.markov_rank,
            markov_head_type="vanilla",
            enable_confidence_head=True,
            confidence_head_with_markov=True,
        )
    return out


def new_drafter(
    target: Transformer, config: dict, kind: str, seed: int, from_target: bool = False
) -> DFlashNet | DSparkNet:
    """Starting weights (`training/init.py`): random, or the target's upper layers (a
    trained drafter's weights are loaded over them by `warm_start`)."""
    if kind == "dspark":
        net: DFlashNet | DSparkNet = DSparkNet(
            DSparkArgs.from_hf(config, name="new"), dtype=torch.float32, device=target.device
        )
    else:
        net = DFlashNet(
            DFlashArgs.from_hf(config, name="new"), dtype=torch.float32, device=target.device
        )
    random_init(net, seed)
    if from_target:
        init_from_target(net, target)
    return net


def warm_start(net: DFlashNet | DSparkNet, target: Transformer, path: Path) -> None:
    """Load a trained drafter's weights (its public format) into `net`, which must have its
    shape: training then goes on from that drafter with a fresh optimiser and schedule."""
    from specgen.drafting.base import method_of
    from specgen.types.errors import CheckpointError
    from specgen.models.drafters.dflash import load_dflash
    from specgen.models.drafters.dspark import load_dspark

    kind = "dspark" if isinstance(net, DSparkNet) else "dflash"
    if method_of(path) != kind:
        raise CheckpointError(f"{path}: a {method_of(path)} drafter cannot start a {kind} one")
    load = load_dspark if kind == "dspark" else load_dflash
    trained = load(path, target=target, target_name="target", name=str(path))
    theirs, ours = trained.state_dict(), net.state_dict()
    wrong = sorted(k for k in ours if k not in theirs or theirs[k].shape != ours[k].shape)
    if wrong:
        raise CheckpointError(
            f"{path}: its shape differs from the drafter being trained ({', '.join(wrong[:3])});"
            " give the same --block-size, --draft-layers, --target-layers and --markov-rank"
        )
    net.load_state_dict(theirs)


@dataclass(frozen=True)
class Kind:
    """What differs between the drafter kinds `train` trains: the config it writes, the
    starting net, the loss of one sequence, the held-out τ and the checkpoint writer."""

    config: Callable[..., dict]  # (target config, target layers, cfg, vocab)
    new: Callable[..., Any]  # (target, config, cfg, vocab) -> net
    trainable: Callable[[Any], list[torch.nn.Parameter]]
    loss: Callable[..., Any]  # trainer.sequence_loss's signature
    evaluate: Callable[..., Any]  # (target, net, held, vocab) -> OfflineAcceptance
    write: Callable[..., None]  # (out, net, config, vocab, record)


def _write_eagle3(out: Path, net, config: dict, vocab: Vocab | None, record: dict) -> None:
    save_eagle3(out, net, config, extra={"specgen_training": record})


BLOCK = Kind(
    config=lambda tc, layers, cfg, vocab: drafter_config(tc, layers, cfg),
    new=lambda target, config, cfg, vocab: new_drafter(
        target, config, cfg.kind, cfg.seed, cfg.init_from_target
    ),
    trainable=trainable,
    # by name, when called (tests stand in for the loss)
    loss=lambda *args, **kwargs: sequence_loss(*args, **kwargs),
    evaluate=lambda *args: offline_acceptance(*args),
    write=lambda out, net, config, vocab, record: _write_drafter(out, net, config, vocab, record),
)
EAGLE3 = Kind(
    config=lambda tc, layers, cfg, vocab: eagle3_config(
        tc,
        cfg.target_layers or default_taps(layers),
        tc.get("vocab_size") if vocab is None else int(vocab.ids.shape[0]),
    ),
    new=lambda target, config, cfg, vocab: new_eagle3(target, config, vocab, cfg.seed),
    trainable=eagle3_trainable,
    loss=eagle3_loss,
    evaluate=lambda target, net, held, vocab: walk(
        eagle3_accepted(target, net, item, vocab) for item in held
    ),
    write=_write_eagle3,
)
KINDS = {"dflash": BLOCK, "dspark": BLOCK, "eagle3": EAGLE3}


def kind_of(name: str) -> Kind:
    return KINDS[name]


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
    net: DFlashNet | DSparkNet | Eagle3Net,
    data: list[Sequence],
    target_name: str,
    cache: Path,
    report: Callable[[dict[str, Any]], None] | None = None,
) -> list[Prepared]:
    """`data` with the target's states at `net`'s taps (and, for DSpark, its last layer),
    from the features cache, on the target's device once: a GPU step then copies nothing
    from the host (and indexes DSpark's last-layer states with device-side positions)."""
    dspark = isinstance(net, DSparkNet)
    if isinstance(net, Eagle3Net):
        taps = net.args.taps
    else:
        taps = tuple((net.backbone if dspark else net).args.target_layer_ids)
    last = target.args.num_layers - 1 if dspark else None
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
    vocab = Vocab.of(target, train_seqs) if cfg.restrict_vocab else None
    kind = kind_of(cfg.kind)
    config = kind.config(target_config, target.args.num_layers, cfg, vocab)
    net = kind.new(target, config, cfg, vocab)
    state_path = out / STATE_FILE
    if cfg.init_from and not (resume and state_path.is_file()):
        warm_start(net, target, Path(cfg.init_from))
    params = kind.trainable(net)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.01)
    step, spent, rng = 0, 0.0, random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    curve: list[list[float]] = []  # [minutes, step, offline τ, loss]
    if resume and state_path.is_file():
        state = load_state(state_path)
        net.load_state_dict(state["net"])
        opt.load_state_dict(state["opt"])
        step, spent = state["step"], state["seconds"]
        rng.setstate(state["rng"])
        gen.set_state(state["gen"])
        curve = state.get("curve", [])
    out.mkdir(parents=True, exist_ok=True)
    used = [s for s in data if id(s) in {id(t) for t in (*train_seqs, *held_seqs)}]
    prepared_all = prepare_all(
        target, net, used, target_name, features_cache or out / "features", report
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

    start = time.perf_counter() - spent
    next_eval = (len(curve) and curve[-1][0] + cfg.eval_minutes) or 0.0
    history: list[float] = []
    while True:
        elapsed = time.perf_counter() - start
        progress = max(
            elapsed / (cfg.minutes * 60) if cfg.minutes else 0.0,
            step / cfg.steps if cfg.steps else 0.0,
        )
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
            save_state(state_path, net, opt, step, time.perf_counter() - start, rng, gen, curve)
            # and the drafter itself: a run stopped at an outer limit still leaves one
            kind.write(out, net, config, vocab, {"steps": step, "finished": False})
    final_loss = sum(history[-20:]) / max(len(history[-20:]), 1)
    evaluate(final_loss)
    seconds = time.perf_counter() - start
    save_state(state_path, net, opt, step, seconds, rng, gen, curve)
    summary = {
        "config": asdict(cfg),
        "steps": step,
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


def _write_drafter(out: Path, net, config: dict, vocab: Vocab | None, record: dict) -> None:
    save_drafter(out, net, config, extra={"specgen_training": record})
    if vocab is not None:  # inference drafts from the rows training ranked
        save_draft_vocab(out, vocab.ids.tolist())


def load_sequences(path: Path) -> list[Sequence]:
    """Training sequences from an answers file (`specgen train --prompts`)."""
    from specgen.training.generate import read_answers

    out = []
    for row in read_answers(path):
        prompt, response = row["prompt_ids"], row["response_ids"]
        if response:
            out.append(Sequence(prompt + response, len(prompt)))
    return out
