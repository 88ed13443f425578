"""A drafter's matrices packed like its target's on the CPU, on request.

A draft step is a few small layers; in fp32 on a 2-core CPU the default's DFlash step cost
about a third of the packed target's decode step, its bytes read again. Packed as int8
(group-wise, models/formats/packed_weight.py) its products are the target's kernels, at a
quarter of the bytes: the draft step fell to about 0.2 of a decode step. End to end it did
not pay (docs/results.md, 2026-12-06): DFlash alone stayed at 0.9x AR, and stacked, which
then chose the cheaper learned drafters more often, fell from 0.92x to 0.83x. So it is
not the default: `SPECGEN_DRAFT_WEIGHTS=int8` asks for it. Drafts may change by the
rounding; what is kept cannot (the target verifies every draft).
"""

from __future__ import annotations

import os

from torch import nn

from specgen.models.formats.weights import convert_weights, weights_identity
from specgen.models.transformer import Transformer

FORMAT = "int8"


def packed_like(net: nn.Module, target: Transformer) -> str:
    """With SPECGEN_DRAFT_WEIGHTS=int8, pack `net`'s dense matrices as int8 when `target`
    runs packed on the CPU; returns what its weights are now (for cost keys)."""
    wanted = os.environ.get("SPECGEN_DRAFT_WEIGHTS", "dense").lower() == FORMAT
    if wanted and target.device.type == "cpu" and "packed" in target.weights_identity:
        import specgen.models.formats.packed_weight  # noqa: F401  (registers int8)

        convert_weights(net, FORMAT)
    return weights_identity(net)
