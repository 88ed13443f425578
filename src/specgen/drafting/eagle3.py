"""`--method eagle3`: an EAGLE-3 drafter drafting a chain of k tokens (models/eagle3.py).

The drafter's entry i pairs the target's fused features at position i with the token at
i + 1, so an entry can be committed only once both are in the target cache: after the
target holds n tokens the drafter's cache holds entries 0..n-2, and the entry of the last
one (whose next token is the anchor) is recomputed with every draft. A step runs the
waiting entries and the anchor's in one causal pass, then k - 1 single-entry chain steps,
each feeding the previous hidden output back with the token it drafted; the chain's K/V
are dropped afterwards (the cache is cropped to the committed entries), and the next
step's pass re-extends it with the target's features of what was committed: DeepSpec's
and EAGLE's `stable_kv`.

The fused features (fc's output) of every committed token are kept, so a rollback to any
length can rebuild the entry that pairs the last kept token with whatever comes next.

k is the verify length the cost scheduler settled before drafting (the drafter has no
confidences), as for DFlash. Drafts are greedy also when sampling: the proposal is a
point mass and the shared verifier's rejection sampling keeps the target's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from specgen.draft import Draft, DraftOption, empty_draft
from specgen.drafting.base import Checkpoint, Drafter, DraftMethod, register
from specgen.errors import SpecgenError
from specgen.models.eagle3 import Eagle3Net, load_eagle3
from specgen.models.eagle3_config import ARCHITECTURES, DEEPSPEC

if TYPE_CHECKING:
    from specgen.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


@register("eagle3")
class Eagle3Method(DraftMethod):
    architectures = (*ARCHITECTURES, *DEEPSPEC, "Gemma4Eagle3Model")
    label = "EAGLE-3"

    def __init__(
        self, net: Eagle3Net, target: Transformer, draft_tokens: int, *, cache_key: str = ""
    ) -> None:
        self.net, self.target = net, target
        self.max_draft_tokens = draft_tokens
        self.cache_key = cache_key

    @classmethod
    def claims(cls, config: dict) -> bool:
        """SafeAILab's own checkpoints say `LlamaForCausalLM`; their draft vocabulary
        tells them apart from a target."""
        return super().claims(config) or (
            "draft_vocab_size" in config and config.get("num_hidden_layers") == 1
        )

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> Eagle3Method:
        if len(checkpoints) != 1:
            raise SpecgenError(f"no {cls.name} drafter given for {target_name}; pass --drafter")
        checkpoint = checkpoints[0]
        if notify:
            notify(f"loading {cls.label} drafter {checkpoint.short_name}")
        net = load_eagle3(
            checkpoint.path, target=target, target_name=target_name, name=checkpoint.name
        )
        k = spec.draft_tokens or net.args.chain
        return cls(net, target, k, cache_key=f"{cls.name}|{checkpoint.path}|{k}")

    def new_drafter(self, capacity: int) -> Eagle3Drafter:
        return Eagle3Drafter(self, capacity)


class Eagle3Drafter(Drafter):
    options = (DraftOption(),)  # one kind of draft; the scheduler settles its length

    def __init__(self, method: Eagle3Method, capacity: int) -> None:
        self.net, self.target = method.net, method.target
        self.taps = self.net.args.taps
        self.max_draft_tokens = method.max_draft_tokens
        self.cache = self.net.new_cache(capacity + self.max_draft_tokens + 1)
        h, device = self.net.args.layers.hidden_size, self.target.device
        self.fused = torch.empty(1, capacity, h, dtype=self.target.dtype, device=device)
        self.ids = torch.zeros(1, capacity, dtype=torch.long, device=device)
        self.length = 0  # committed target tokens this drafter follows

    def tensors(self) -> list[torch.Tensor]:
        return [*self.net.parameters(), self.cache.k, self.cache.v, self.fused]

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)
        # entry i needs token i + 1: keep those whose next token is still committed
        self.cache.rollback(min(self.cache.length, max(self.length - 1, 0)))

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        n, t = self.length, len(tokens)
        features = torch.cat([taps[i] for i in self.taps], dim=-1)  # [1, T, K*Ht]
        self.fused[:, n : n + t] = self.net.project(features)
        self.ids[0, n : n + t] = torch.tensor(tokens, device=self.ids.device)
        self.length = n + t

    @torch.inference_mode()
    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        k = min(max_tokens, self.max_draft_tokens)
        if k <= 0 or self.length == 0:
            return empty_draft(self.target.device)
        net, target, cache, n = self.net, self.target, self.cache, self.length
        c = cache.length  # entries 0..c-1 committed; c..n-1 wait (n-1 pairs with the anchor)
        anchor_t = torch.tensor([[anchor]], device=self.ids.device)
        ids = torch.cat([self.ids[:, c + 1 : n], anchor_t], dim=1)
        hidden = net(target, ids, self.fused[:, c:n], cache)[:, -1:]
        tokens = []
        for j in range(k):
            token = net.to_target[net.logits(target, hidden).argmax(dim=-1)]  # [1, 1]
            tokens.append(token)
            if j + 1 < k:
                hidden = net(target, token, hidden, cache)
        cache.rollback(n - 1)  # the anchor's entry and the chain's are not committed
        return Draft(tokens=torch.cat(tokens, dim=1))
