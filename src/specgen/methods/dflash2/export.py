"""DFlash 2 on the serving engines. vLLM runs it under its "dflash" method, which picks
the DFlash 2 model from the checkpoint's architecture (vLLM PR #52816's registry entry;
"dflash2" is refused); SGLang as DFLASH2."""

from __future__ import annotations

from specgen.drafting.export_hints import ExportHints, ServeTarget


class DFlash2Export(ExportHints):
    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        pr = "vLLM PR #52816" if engine == "vllm" else "SGLang PR #35371 (DFLASH2)"
        return [
            f"DFlash 2 needs an engine build with it ({pr} when this was written); these flags "
            "follow that work's tests and scripts, not a released engine's docs"
        ]


EXPORT = DFlash2Export(default_block=8, vllm_method="dflash")
