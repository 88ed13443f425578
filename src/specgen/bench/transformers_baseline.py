"""The `hf` bench method: transformers' own `generate` on the same checkpoint and dtype.

specgen's AR loop is the baseline every speedup is measured against; this one answers the
question a user actually has ("faster than what I would otherwise run?"). It loads the
model directory specgen resolved (for a GGUF target such as the embedded default: its
dequantized safetensors copy) with `AutoModelForCausalLM` at the target's dtype and
device, and decodes the same prompt ids with `generate` (greedy, or the same temperature,
top-k and top-p), batch 1, KV cache on. A streamer marks the first new token for TTFT. At
T = 0 in fp32 its tokens equal specgen AR's, which the bench's identity check shows.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from specgen.core.config import SamplingParams
from specgen.core.stats import GenStats


class _FirstToken:
    """A transformers streamer (put/end) that notes when the first new token arrives."""

    def __init__(self) -> None:
        self.calls = 0
        self.first: float | None = None

    def put(self, value) -> None:
        self.calls += 1
        if self.calls == 2 and self.first is None:  # the first call carries the prompt
            self.first = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersBaseline:
    name = "hf"

    def __init__(self, path: Path, dtype: torch.dtype, device: torch.device, stop_ids) -> None:
        from transformers import AutoModelForCausalLM

        if path.suffix == ".gguf":  # transformers reads the dequantized copy specgen caches
            from specgen.models.formats.gguf.convert import ensure_converted

            path = ensure_converted(path, weights=True)
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
        self.device = device
        self.stop_ids = sorted(stop_ids)

    def run(self, ids: list[int], max_new_tokens: int, sampling: SamplingParams):
        """(new tokens, GenStats) for one answer."""
        if sampling.seed is not None:
            torch.manual_seed(sampling.seed)
        options = {"do_sample": False}
        if not sampling.greedy:
            options = {
                "do_sample": True,
                "temperature": sampling.temperature,
                "top_k": sampling.top_k or None,
                "top_p": sampling.top_p,
            }
        clock = _FirstToken()
        inputs = torch.tensor([ids], device=self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=max_new_tokens,
                eos_token_id=self.stop_ids or None,
                pad_token_id=self.stop_ids[0] if self.stop_ids else 0,
                streamer=clock,
                **options,
            )
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        tokens = out[0, len(ids) :].tolist()
        if tokens and tokens[-1] in self.stop_ids:  # specgen's answers exclude the stop token
            tokens = tokens[:-1]
        stats = GenStats(
            prompt_tokens=len(ids),
            prefill_tokens=len(ids),
            new_tokens=len(tokens),
            steps=len(tokens),
            seconds=seconds,
            ttft_seconds=(clock.first - start) if clock.first else seconds,
        )
        return tokens, stats

    def memory_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())
