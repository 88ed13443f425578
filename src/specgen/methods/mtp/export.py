"""MTP on the serving engines: the target's own MTP layers draft a chain of k tokens, top-1
at each step (vLLM's `mtp` method, which it maps to `qwen3_5_mtp` for Qwen3.5; SGLang's
NEXTN; llama.cpp's `draft-mtp` on a GGUF that keeps the MTP layers)."""

from __future__ import annotations

from specgen.drafting.export_hints import ExportHints, ServeTarget


class MtpExport(ExportHints):
    def drafts(self, serve: ServeTarget) -> int:
        return serve.block_size  # a chain of k drafts

    def block_of(self, drafter: str) -> int:
        return self.default_block  # no drafter config: the chain specgen drafts

    def sglang_flags(self, serve: ServeTarget) -> list[str]:
        k = serve.block_size
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]  # fmt: skip

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        k = serve.block_size
        return [
            "the MTP layers ship in the target's checkpoint (mtp.*): nothing else to download",
            "on llama.cpp (late 2026): llama-server -m TARGET.gguf --spec-type draft-mtp "
            f"--spec-draft-n-max {k} (a GGUF converted with its MTP layers, e.g. the Qwen3.5 "
            "MTP GGUFs)",
        ]


# the chain specgen drafts by default (its scheduler then verifies what pays)
EXPORT = MtpExport(default_block=3, vllm_method="mtp",
                   sglang_algorithm="NEXTN", own_head=True)  # fmt: skip
