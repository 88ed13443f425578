"""specgen: lossless speculative decoding for local LLM generation.

Public API:
    Pipeline.load(model, device=..., dtype=...) -> Pipeline
    Pipeline.generate(prompt, ...) -> Completion
    Pipeline.stream(prompt, ...) -> Iterator[Chunk]
    SamplingParams(temperature, top_k, top_p, seed)
    SpecConfig(method=AR | "ngram" | "dflash" | "dspark" | "stacked", drafter, ...)  (AR = "ar")
    Pipeline.with_spec(spec) -> another method on the same loaded target
    Pipeline.generate_many(prompts, parallel=4) -> list[Completion], batched
    Streams(pipes, parallel) -> several answers at once (open / step / close)
"""

import os

# Before torch loads libgomp: its OpenMP threads spin-wait far shorter than libgomp's
# default before they sleep. Beside another busy process on a small machine long spins
# starve the very thread they wait for and decoding collapses; short ones keep the idle
# speed (docs/results.md, "Threads beside a busy process"). OMP_WAIT_POLICY or
# GOMP_SPINCOUNT choose otherwise; nothing changes when torch was imported first.
if "OMP_WAIT_POLICY" not in os.environ:
    os.environ.setdefault("GOMP_SPINCOUNT", "3000")

from specgen.api.pipeline import Chunk, Completion, Pipeline
from specgen.api.streams import Stream, Streams
from specgen.core.config import AR, ModelArgs, SamplingParams, SpecConfig
from specgen.core.errors import SpecgenError
from specgen.core.stats import GenStats

__version__ = "0.1.0"

__all__ = [
    "AR",
    "Chunk",
    "Completion",
    "GenStats",
    "ModelArgs",
    "Pipeline",
    "SamplingParams",
    "SpecConfig",
    "SpecgenError",
    "Stream",
    "Streams",
    "__version__",
]
