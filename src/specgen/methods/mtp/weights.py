"""Where a target's MTP layers come from, and the refusals when it has none specgen runs.

Published Qwen3.5 / 3.6 checkpoints carry the head beside the decoder (`mtp.*`, config
`mtp_num_hidden_layers`: 1 in every one published), so `--method mtp` reads the target's
own files: no extra download. `--drafter` may instead name an MTP-only safetensors file
(or a directory of them) in the same names, e.g. the head cut out of a checkpoint whose
decoder is run from a GGUF file.
"""

from __future__ import annotations

import re
from pathlib import Path

from specgen.core.errors import CheckpointError
from specgen.methods.mtp.network import PREFIX, MtpNet
from specgen.models.loading import SafetensorsIndex, fill
from specgen.models.transformer import Transformer

FAMILIES = ("qwen3_5",)  # targets whose MTP layer specgen computes
LAYER = re.compile(r"^mtp\.layers\.(\d+)\.")


def load_mtp(target: Transformer, source: Path | None, *, target_name: str, name: str) -> MtpNet:
    """The MTP head for `target`, from `source` (a --drafter file or directory) or else
    the target's own checkpoint; refused in one line where there is none to run."""
    if target.args.family not in FAMILIES:
        raise CheckpointError(
            f"{target_name} has no MTP layers specgen runs (a {target.args.family} target); "
            "--method mtp drafts with the MTP head Qwen3.5 / 3.6 checkpoints ship"
        )
    if source is None:
        source, name = _own_checkpoint(target, target_name), target_name
    index = SafetensorsIndex(source, name)
    layers = sorted({int(m.group(1)) for k in index.where if (m := LAYER.match(k))})
    if not any(k.startswith(PREFIX) for k in index.where):
        raise CheckpointError(
            f"{name} has no MTP layers (no {PREFIX}* tensors in its weights): --method mtp "
            "needs a checkpoint that ships them, or --drafter with an MTP-only file"
        )
    if len(layers) > 1:  # (none: the fill below names the missing layer's tensors)
        raise CheckpointError(
            f"{name}: {len(layers)} MTP layers; specgen runs a head of one "
            "(mtp_num_hidden_layers 1, as every Qwen3.5 / 3.6 checkpoint has)"
        )
    net = MtpNet(target.args, dtype=target.dtype, device=target.device)
    fill(net.plan(), index, net.device)
    net.finish_load()
    return net.eval()


def _own_checkpoint(target: Transformer, target_name: str) -> Path:
    source = target.source
    if source is None:
        raise CheckpointError(f"{target_name}: where its weights came from is not known")
    if source.is_file():  # a GGUF file: llama.cpp's MTP tensors are not read here
        raise CheckpointError(
            f"{target_name}: MTP layers are not read from GGUF files; pass --drafter with "
            "the checkpoint's mtp.* tensors (a safetensors file or directory)"
        )
    return source
