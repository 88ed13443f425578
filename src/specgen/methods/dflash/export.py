"""DFlash on the serving engines: vLLM's and SGLang's `dflash`, B - 1 drafts per block."""

from __future__ import annotations

from specgen.drafting.export_hints import ExportHints, ServeTarget


class DFlashExport(ExportHints):
    def vllm_flags(self, serve: ServeTarget) -> list[str]:
        if serve.hybrid:  # z-lab's flags for its Qwen3.5 drafters
            return ["--attention-backend", "flash_attn", "--max-num-batched-tokens", "32768"]
        return []

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        if serve.gemma and engine == "vllm":
            return [
                "z-lab's Gemma 4 drafters need a vLLM with DFlash for Gemma 4 targets "
                "(vLLM PR #41703 when this was written)"
            ]
        return []


EXPORT = DFlashExport(default_block=16)
