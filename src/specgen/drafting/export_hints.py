"""What `specgen export` needs of a drafter method to serve it on vLLM or SGLang: each
exportable method's package supplies an `ExportHints` (`DraftMethod.export`), and
`specgen/export.py` builds the launch command from it without naming a method.

The engines' flags are their current ones (research/baselines.md): vLLM takes one
`--speculative-config` JSON, SGLang `--speculative-algorithm` with its own flags.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServeTarget:
    target: str  # Hub repo id or local HF directory
    method: str
    drafter: str  # Hub repo id or local directory
    block_size: int  # the drafter's block (DFlash: B positions; DSpark, EAGLE-3: drafts)
    hybrid: bool = False  # recurrent layers (Qwen3.5): the engines keep state buffers
    thinking: bool | None = None  # the chat mode the drafter was trained with
    gemma: bool = False  # a Gemma 4 target (the engines' support differs)


@dataclass(frozen=True)
class ExportHints:
    """A method's flags on the serving engines. The defaults are a block drafter's whose
    slot 0 is the anchor (DFlash): B - 1 drafts per block."""

    default_block: int  # the published drafters' block (or chain) length
    block_field: str = "block_size"  # where a local drafter's config.json keeps it
    vllm_method: str = ""  # the name vLLM knows it by ("": the method's own)
    sglang_algorithm: str = ""  # SGLang's --speculative-algorithm ("": the method's, upper case)
    # the target drafts with its own layers (MTP): no drafter to name, none to download
    own_head: bool = False

    def drafts(self, serve: ServeTarget) -> int:
        """Draft tokens per step the engines should verify."""
        return serve.block_size - 1

    def vllm_config(self, serve: ServeTarget) -> dict[str, object]:
        """vLLM's `--speculative-config`."""
        method = self.vllm_method or serve.method
        if self.own_head:
            return {"method": method, "num_speculative_tokens": self.drafts(serve)}
        return {"method": method, "model": serve.drafter,
                "num_speculative_tokens": self.drafts(serve)}  # fmt: skip

    def vllm_flags(self, serve: ServeTarget) -> list[str]:
        """Further vLLM flags this method needs."""
        return []

    def sglang_flags(self, serve: ServeTarget) -> list[str]:
        """SGLang's flags after the draft model's path."""
        return ["--speculative-num-draft-tokens", str(serve.block_size)]

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        """What the user should know about running this method there."""
        return []

    def block_of(self, drafter: str) -> int:
        """The block size in a local drafter's config, else the published default."""
        config = Path(drafter).expanduser() / "config.json"
        if config.is_file():
            try:
                cfg = json.loads(config.read_text(encoding="utf-8"))
                nested = cfg.get("dflash_config") or {}  # DFlash 2 keeps it there
                return int(nested.get(self.block_field, cfg[self.block_field]))
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
        return self.default_block
