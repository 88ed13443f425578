"""A training run's resumable state in one safetensors file (specgen loads no pickles).

The tensors (drafter weights, the optimiser's per-parameter tensors, the torch generator's
state) are the file's tensors; everything else (step, elapsed seconds, the Python RNG's
state, the τ curve, the optimiser's hyper-parameters and non-tensor entries) is JSON in
its metadata. One file, written to a temporary name and renamed, so a run killed mid-write
leaves the previous state whole. Loading gives back the dict `train` saved, so a resumed
run continues bit for bit.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

FILE = "state.safetensors"


def save_state(
    path: Path, net: torch.nn.Module, opt: torch.optim.Optimizer, step: int, seconds: float,
    rng: random.Random, gen: torch.Generator, curve: list, vocab: list[int] | None = None,
) -> None:  # fmt: skip
    # copies on the CPU: safetensors refuses tensors that share storage
    tensors = {f"net.{k}": v.detach().to("cpu", copy=True) for k, v in net.state_dict().items()}
    opt_state = opt.state_dict()
    plain: dict[str, dict[str, Any]] = {}
    for index, entry in opt_state["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"opt.{index}.{key}"] = value.detach().to("cpu", copy=True)
            else:
                plain.setdefault(str(index), {})[key] = value
    tensors["gen"] = gen.get_state()
    record = {
        "step": step,
        "seconds": seconds,
        "rng": rng.getstate(),
        "curve": curve,
        "vocab": vocab,  # the draft vocabulary's token ids (None: the whole head)
        "param_groups": opt_state["param_groups"],
        "opt_plain": plain,
    }
    tmp = path.with_suffix(".tmp")
    save_file(tensors, str(tmp), metadata={"state": json.dumps(record)})
    tmp.replace(path)


def load_state(path: Path) -> dict[str, Any]:
    """{"net", "opt", "step", "seconds", "rng", "gen", "curve", "vocab"} as `save_state`
    was given (an older state without a vocabulary: None)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        record = json.loads(f.metadata()["state"])
        tensors = {key: f.get_tensor(key) for key in f.keys()}
    net = {k[4:]: v for k, v in tensors.items() if k.startswith("net.")}
    opt_state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if key.startswith("opt."):
            _, index, name = key.split(".", 2)
            opt_state.setdefault(int(index), {})[name] = value
    for index, entry in record["opt_plain"].items():
        opt_state.setdefault(int(index), {}).update(entry)
    version, internal, gauss = record["rng"]
    return {
        "net": net,
        "opt": {"state": opt_state, "param_groups": record["param_groups"]},
        "step": record["step"],
        "seconds": record["seconds"],
        "rng": (version, tuple(internal), gauss),
        "gen": tensors["gen"],
        "curve": record["curve"],
        "vocab": record.get("vocab"),
    }
