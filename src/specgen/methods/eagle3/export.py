"""EAGLE-3 on the serving engines: a chain of k drafts (DeepSpec's ttt_length), top-1 at
each step, as specgen drafts."""

from __future__ import annotations

import json
from pathlib import Path

from specgen.drafting.export_hints import ExportHints, ServeTarget
from specgen.methods.eagle3.config import DEEPSPEC, DEEPSPEC_GEMMA


def deepspec_layout(drafter: str) -> bool:
    """DeepSpec's EAGLE-3 format: by its repo name, or a local directory's config."""
    if Path(drafter).name.startswith("eagle3_") or "deepseek-ai/eagle3" in drafter:
        return True
    config = Path(drafter).expanduser() / "config.json"
    try:
        architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures")
    except (OSError, ValueError, AttributeError):
        return False
    return bool({*DEEPSPEC, *DEEPSPEC_GEMMA} & set(architectures or []))


class Eagle3Export(ExportHints):
    def drafts(self, serve: ServeTarget) -> int:
        return serve.block_size  # a chain of k drafts

    def sglang_flags(self, serve: ServeTarget) -> list[str]:
        k = serve.block_size
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]  # fmt: skip

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        if not deepspec_layout(serve.drafter):
            return []
        return [
            "DeepSpec's EAGLE-3 drafters (Qwen3Eagle3Model, Gemma4Eagle3Model: 5 taps, full "
            "vocabulary) are DeepSpec's own format; whether this engine loads them is "
            "unconfirmed"
        ]


EXPORT = Eagle3Export(default_block=7, block_field="ttt_length")
