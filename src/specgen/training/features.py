"""The frozen target's hidden states for training, computed once and kept on disk.

A drafter trains on the outputs of a few target layers (its taps, plus the last layer for
DSpark's target distribution) at every position of every sequence. Computing them is one
teacher-forced target forward per sequence, a tenth of the cost of generating the data but
still minutes for 200k tokens on a CPU, so each run (and each resumed or ablation run)
reuses them: shards of 64 sequences under `<cache>/<target digest>/`, one bf16 tensor per
layer (bf16, not fp16: SmolLM2's upper layers reach 2.5e4). Each shard is named by the
digest of its own sequences' token ids, so changed data never meets stale features, and
answers appended to a data file reuse every full shard before them (only the last,
partial one and the new ones are computed). A shard missing a requested layer is
recomputed with the union of layers; an interrupted run resumes at the first missing shard.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specgen.models.transformer import Transformer
from specgen.training.trainer import Sequence, layer_outputs

SHARD = 64


def data_digest(target_name: str, sequences: list[Sequence]) -> str:
    h = hashlib.sha256(target_name.encode())
    for seq in sequences:
        h.update(json.dumps([seq.ids, seq.response_start]).encode())
    return h.hexdigest()[:16]


@torch.inference_mode()
def target_features(
    target: Transformer,
    target_name: str,
    sequences: list[Sequence],
    layers: tuple[int, ...],
    cache: Path,
    report: Callable[[dict], None] | None = None,
) -> list[dict[int, torch.Tensor]]:
    """Per sequence, {layer: [N, H] bf16 output of that target layer}."""
    folder = cache / data_digest(target_name, [])
    folder.mkdir(parents=True, exist_ok=True)
    out: list[dict[int, torch.Tensor]] = []
    for first in range(0, len(sequences), SHARD):
        group = sequences[first : first + SHARD]
        path = folder / f"shard-{data_digest(target_name, group)}.safetensors"
        stored = _read(path, len(group))
        if stored is None or not set(layers) <= set(stored[0]):
            have = set(stored[0]) if stored else set()
            stored = [
                layer_outputs(target, seq, tuple(sorted(have | set(layers)))) for seq in group
            ]
            tmp = path.with_suffix(".tmp")
            tensors = {f"{i}.{k}": t for i, row in enumerate(stored) for k, t in row.items()}
            save_file(tensors, str(tmp))
            tmp.replace(path)
        out.extend({layer: row[layer] for layer in layers} for row in stored)
        if report:
            report({"prepared": len(out), "of": len(sequences)})
    return out


def _read(path: Path, count: int) -> list[dict[int, torch.Tensor]] | None:
    if not path.is_file():
        return None
    try:
        flat = load_file(str(path))
    except Exception:  # a torn write from a killed run: recompute the shard
        return None
    rows: list[dict[int, torch.Tensor]] = [{} for _ in range(count)]
    for key, tensor in flat.items():
        i, layer = key.split(".")
        if int(i) >= count:
            return None
        rows[int(i)][int(layer)] = tensor
    if any(set(row) != set(rows[0]) for row in rows):
        return None
    return rows
