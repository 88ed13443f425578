"""specgen: lossless speculative decoding for local LLM generation.

Public API:
    Pipeline.load(model, device=..., dtype=...) -> Pipeline
    Pipeline.generate(prompt, ...) -> Completion
    Pipeline.stream(prompt, ...) -> Iterator[Chunk]
    SamplingParams(temperature, top_k, top_p, seed)
    SpecConfig(method="ar" | "ngram" | "dflash" | "dspark" | "stacked", drafter, ...)
    Pipeline.with_spec(spec) -> another method on the same loaded target
"""

from specgen.config import ModelArgs, SamplingParams, SpecConfig
from specgen.errors import SpecgenError
from specgen.pipeline import Chunk, Completion, Pipeline
from specgen.stats import GenStats

__version__ = "0.1.0"

__all__ = [
    "Chunk",
    "Completion",
    "GenStats",
    "ModelArgs",
    "Pipeline",
    "SamplingParams",
    "SpecConfig",
    "SpecgenError",
    "__version__",
]
