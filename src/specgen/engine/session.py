"""A conversation's state on the target: its KV cache and the tokens that fill it.

Consecutive prompts usually share a prefix (a chat's history, a bench suite's system
prompt). `prepare` keeps the cached part of that prefix and returns only the tokens that
still need a prefill. `settle` re-establishes the invariant "the cache holds exactly the
K/V of `ids`" after a generation, including one interrupted by Ctrl-C mid-step.
"""

from __future__ import annotations

from specgen.drafting.base import Drafter
from specgen.engine.answer import reusable_prefix
from specgen.models.graphs import GraphedForward
from specgen.models.transformer import Transformer
from specgen.scheduling.scheduler import VerifyScheduler


class Session:
    def __init__(
        self,
        model: Transformer,
        capacity: int,
        drafter: Drafter | None = None,
        scheduler: VerifyScheduler | None = None,
        *,
        graphs: bool = False,
    ) -> None:
        # the longest step: every position of it can be rolled back to (a hybrid target
        # keeps recurrent state for that)
        max_tokens = 1 + (drafter.max_draft_tokens if drafter is not None else 0)
        self.cache = model.new_cache(capacity, steps=max_tokens)
        self.device = model.device
        # what the decoding loops call for target forwards: the model itself, or its decode
        # and verify steps as CUDA graphs bound to this session's cache
        self.forward: Transformer | GraphedForward = model
        if graphs:
            self.forward = GraphedForward(model, self.cache, max_tokens=max_tokens, capture=True)
        self.drafter = drafter  # its context mirrors the cache: rolled back with it
        self.scheduler = scheduler  # acceptance estimates of this conversation
        self.ids: list[int] = []  # tokens whose K/V are in the cache, in order

    @property
    def capacity(self) -> int:
        return self.cache.capacity

    def prepare(self, prompt_ids: list[int]) -> list[int]:
        """Roll the cache back to the longest reusable prefix; return the ids to prefill."""
        keep = reusable_prefix(self.ids, prompt_ids, self.capacity)
        keep = self.cache.restorable(keep)  # a hybrid target's state may reach less far back
        self._rollback(keep)
        self.ids = list(prompt_ids[:keep])
        return list(prompt_ids[keep:])

    def settle(self, sequence: list[int]) -> None:
        """After generating `sequence` (prompt + output), trust only what the cache holds."""
        n = self.cache.restorable(min(self.cache.length, len(sequence)))
        self._rollback(n)
        self.ids = list(sequence[:n])

    def reset(self) -> None:
        self._rollback(0)
        self.ids = []

    def _rollback(self, length: int) -> None:
        self.cache.rollback(length)
        if self.drafter is not None:
            self.drafter.rollback(length)
