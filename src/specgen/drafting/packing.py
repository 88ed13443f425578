"""A drafter's matrices packed like its target's on the CPU.

A draft step is a few small layers; in fp32 on a 2-core CPU it cost about a third of the
packed target's decode step (the weights' bytes, again), which ate most of what drafting
saves. Packed as int8 (group-wise, models/formats/packed_weight.py) its products are the
target's kernels, at a quarter of the bytes. Drafts may change by the rounding; what is
kept does not (the target verifies every draft), so every method stays lossless.
`SPECGEN_DRAFT_WEIGHTS=dense` keeps a drafter's own weights (comparisons, oracles).
"""

from __future__ import annotations

import os

from torch import nn

from specgen.models.formats.weights import convert_weights, weights_identity
from specgen.models.transformer import Transformer

FORMAT = "int8"


def packed_like(net: nn.Module, target: Transformer) -> str:
    """Pack `net`'s dense matrices as int8 when `target` runs packed on the CPU (unless
    SPECGEN_DRAFT_WEIGHTS=dense); returns what its weights are now (for cost keys)."""
    wanted = os.environ.get("SPECGEN_DRAFT_WEIGHTS", FORMAT).lower() != "dense"
    if wanted and target.device.type == "cpu" and "packed" in target.weights_identity:
        import specgen.models.formats.packed_weight  # noqa: F401  (registers int8)

        convert_weights(net, FORMAT)
    return weights_identity(net)
