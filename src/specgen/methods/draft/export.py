"""A draft model on the serving engines: vLLM's `draft_model`, SGLang's `STANDALONE` (a
chain of k top-1 drafts from a smaller model), and the same pairing on llama.cpp
(`-md`), named in a note since `specgen export` launches vLLM or SGLang."""

from __future__ import annotations

from specgen.drafting.export_hints import ExportHints, ServeTarget


class DraftModelExport(ExportHints):
    def drafts(self, serve: ServeTarget) -> int:
        return serve.block_size  # a chain of k drafts

    def sglang_flags(self, serve: ServeTarget) -> list[str]:
        k = serve.block_size
        return ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]  # fmt: skip

    def notes(self, engine: str, serve: ServeTarget) -> list[str]:
        return [
            "the draft model must share the target's tokenizer (specgen checks it; the "
            "engines check the vocabulary size only)",
            "on llama.cpp (late 2026) the same pairing is: llama-server -m TARGET.gguf "
            f"--spec-type draft-simple --model-draft DRAFT.gguf --spec-draft-n-max "
            f"{serve.block_size}",
        ]

    def block_of(self, drafter: str) -> int:
        """A draft model's config has no chain length: the published default."""
        return self.default_block


EXPORT = DraftModelExport(default_block=5, vllm_method="draft_model", sglang_algorithm="STANDALONE")
