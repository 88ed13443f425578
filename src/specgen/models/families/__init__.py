"""The target families. Importing this package registers each one (models/family.py).

`model_args` reads a Hub config.json into `ModelArgs` through the family its
`model_type` names; unsupported features (exotic RoPE scaling, mixture-of-experts layers,
per-layer embeddings) are refused in one line rather than silently computed wrong.
"""

from __future__ import annotations

from typing import Any

from specgen.core.config import ModelArgs
from specgen.models.families import gemma3, gemma4, llama, qwen3_5  # noqa: F401  (registers)
from specgen.models.families.qwen3_5 import moe_refusal
from specgen.models.family import family_for_type

# Families whose mixture-of-experts variants specgen does not run (no expert layers).
MOE_TYPES = {"qwen3_5_moe": "Qwen3.5", "qwen3_5_moe_text": "Qwen3.5", "qwen3_next": "Qwen3-Next"}


def model_args(cfg: dict[str, Any], *, name: str = "model") -> ModelArgs:
    """A target's `ModelArgs` from its parsed HF config.json; `name` is only used in error
    messages. Unknown keys are ignored."""
    model_type = cfg.get("model_type")
    if model_type in MOE_TYPES or cfg.get("num_experts"):
        raise moe_refusal(name, MOE_TYPES.get(str(model_type), str(model_type)))
    return family_for_type(model_type, cfg, name).parse(cfg, name)
