"""DSpark on the serving engines: anchor-first blocks (γ drafts), sampled drafts and the
confidence scheduler on vLLM, SGLang's DSpark block flag."""

from __future__ import annotations

from specgen.drafting.export_hints import ExportHints, ServeTarget


class DSparkExport(ExportHints):
    def drafts(self, serve: ServeTarget) -> int:
        return serve.block_size  # anchor-first: every slot is a draft

    def vllm_config(self, serve: ServeTarget) -> dict[str, object]:
        return {
            **super().vllm_config(serve),
            "draft_sample_method": "probabilistic",  # sample drafts at T > 0 (exact)
            "enable_adaptive_verification": True,  # vLLM's confidence scheduler
        }

    def sglang_flags(self, serve: ServeTarget) -> list[str]:
        return ["--speculative-dspark-block-size", str(serve.block_size)]

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        out = []
        if serve.gemma and engine == "sglang":
            out.append("SGLang's DSpark support for DeepSpec's Gemma 4 drafters is unconfirmed")
        if engine == "vllm":
            out.append(
                "enable_adaptive_verification needs full CUDA-graph mode; drop it to verify "
                "every draft"
            )
        return out


EXPORT = DSparkExport(default_block=7)
