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

from specgen.core import spin

# Before torch loads libgomp: its idle OpenMP threads spin far shorter than libgomp's
# default before they sleep, so a busy neighbour process keeps the idle speed
# (core/spin.py; `specgen serve` spins longer). OMP_WAIT_POLICY or GOMP_SPINCOUNT choose
# otherwise; nothing changes when torch was imported first.
spin.choose(spin.DEFAULT)

__version__ = "0.1.0"

# The public names, imported when first used: `import specgen` (and so every command's
# `--help`, `specgen models`, an argument error) does not pay for torch and transformers
# until a name that needs them is asked for.
_PUBLIC = {
    "AR": "specgen.core.config",
    "ModelArgs": "specgen.core.config",
    "SamplingParams": "specgen.core.config",
    "SpecConfig": "specgen.core.config",
    "SpecgenError": "specgen.core.errors",
    "GenStats": "specgen.core.stats",
    "Chunk": "specgen.api.pipeline",
    "Completion": "specgen.api.pipeline",
    "Pipeline": "specgen.api.pipeline",
    "Stream": "specgen.api.streams",
    "Streams": "specgen.api.streams",
}


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        value = getattr(importlib.import_module(_PUBLIC[name]), name)
        globals()[name] = value  # once: later lookups find it here
        return value
    raise AttributeError(f"module 'specgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_PUBLIC])


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
