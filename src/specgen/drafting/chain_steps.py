"""The fixed-shape draft chains of a one-layer autoregressive drafter (EAGLE-3, a model's
MTP layer), for the device-resident loop and CUDA graphs: one chain per (k, sampling
setting), built at its first use, with the anchor and the committed length read from
device memory. With `capture` each is a CUDA graph (its own memory pool), else it runs as
it is (the CPU, and graphs off). What a chain computes is the method's (`chain`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft
from specgen.models.graphs import Replay, set_input

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams
    from specgen.models.cache.kv import StaticKVCache

# (anchor [1, 1], start [1], k, params or None, noise or None) -> k drafts, device ops only
Chain = Callable[
    [torch.Tensor, torch.Tensor, int, "SamplingParams | None", "torch.Tensor | None"], Draft
]


class ChainSteps:
    def __init__(
        self,
        chain: Chain,
        net: torch.nn.Module,  # whose RoPE tables (`_cos`, `_sin`) the chains read
        cache: StaticKVCache,
        noise: torch.Tensor,  # [max drafts, V], refilled by the drafter before a sampled chain
        capture: bool,
    ) -> None:
        self.chain, self.noise, self.capture = chain, noise, capture
        device = noise.device
        self.anchor = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.start = torch.ones(1, dtype=torch.long, device=device)
        # a graph reads the RoPE tables it was captured with: keep them alive with it
        self._tables = (net._cos, net._sin)
        self._steps: dict[tuple, Replay] = {}
        cache.make_finite()  # the masked attention reads dead positions (weighted by 0)

    @property
    def replays(self) -> list[Replay]:
        return list(self._steps.values())

    def __call__(
        self,
        anchor: int | torch.Tensor,
        start: int | torch.Tensor,
        k: int,
        params: SamplingParams | None,  # None: greedy
    ) -> Draft:
        """k drafts after `anchor` (a host int, or [1, 1] on the device) at `start` (a host
        int, or [1] on the device), copied out of the graph's outputs."""
        set_input(self.anchor, anchor)
        set_input(self.start, start)
        key = (k, None if params is None else (params.temperature, params.top_k, params.top_p))
        step = self._steps.get(key)
        if step is None:
            pool = torch.cuda.graph_pool_handle() if self.capture else None
            step = Replay(lambda: self._chain(k, params), pool)
            self._steps[key] = step
        out = step()
        return Draft(
            tokens=out.tokens.clone(), probs=None if out.probs is None else out.probs.clone()
        )

    def _chain(self, k: int, params: SamplingParams | None) -> Draft:
        noise = None if params is None else self.noise
        return self.chain(self.anchor, self.start, k, params, noise)
