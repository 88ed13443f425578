"""`--method eagle3`: an EAGLE-3 drafter drafting a chain of k tokens (methods/eagle3/network.py).

The drafter's entry i pairs the target's fused features at position i with the token at
i + 1, so an entry can be committed only once both are in the target cache: after the
target holds n tokens the drafter's cache holds entries up to n - 2 (some may wait), and
the entry of the last one (whose next token is the anchor) is recomputed with every
draft. A step runs the waiting entries and the anchor's in one causal pass, then k - 1
single-entry chain steps, each feeding the previous hidden output back with the token it
drafted; the chain's K/V are dropped afterwards (the cache is cropped to the committed
entries), and the next step's pass re-extends it with the target's features of what was
committed: DeepSpec's and EAGLE's `stable_kv`.

The fused features (fc's output) of every committed token are kept, so a rollback to any
length can rebuild the entry that pairs the last kept token with whatever comes next.

The device-resident loop (engine/resident.py) drives it from device state: `observe_at`
writes the verified block's features and runs its entries at once (entry start - 1 + j
pairs position start - 1 + j with block token j; those past the accepted ones are
overwritten by the next step's), so entries up to n - 2 are always in the cache and a
draft is a fixed-shape chain (methods/eagle3/chain.py), a CUDA graph per length on CUDA.

k is the verify length the cost scheduler settled before drafting (the drafter has no
confidences), as for DFlash. Greedy drafts are the argmax chain (a point mass). Sampling
(temperature > 0) draws the chain from the drafter's distribution under the request's
filters, as DeepSpec's EAGLE-3 evaluator does (temperature only there; its code says it
follows SpecForge's eval), and hands that q to the shared verifier, whose rejection
sampling keeps the target's distribution. docs/design.md says why, with measurements.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.core.errors import SpecgenError
from specgen.drafting.base import Checkpoint, DraftMethod, ResidentDrafter, register
from specgen.drafting.chain_steps import ChainSteps
from specgen.drafting.packing import packed_like
from specgen.methods.eagle3.chain import chain, pick
from specgen.methods.eagle3.config import ARCHITECTURES, DEEPSPEC, DEEPSPEC_GEMMA
from specgen.methods.eagle3.export import EXPORT
from specgen.methods.eagle3.network import Eagle3Net, load_eagle3
from specgen.methods.eagle3.training import Eagle3Training
from specgen.models.graphs import StepGraphs

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


CHAINS = "chains"  # the one key of its fixed-shape steps (ChainSteps keys its own)


@register("eagle3")
class Eagle3Method(DraftMethod):
    architectures = (*ARCHITECTURES, *DEEPSPEC, *DEEPSPEC_GEMMA)
    training = Eagle3Training()
    export = EXPORT
    label = "EAGLE-3"

    def __init__(
        self,
        net: Eagle3Net,
        target: Transformer,
        draft_tokens: int,
        *,
        cache_key: str = "",
        cuda_graphs: bool = False,
    ) -> None:
        self.net, self.target = net, target
        self.max_draft_tokens = draft_tokens
        self.cache_key = cache_key
        self.cuda_graphs = cuda_graphs  # draft chains as CUDA graphs

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
        graphs = spec.cuda_graphs and target.device.type == "cuda"
        key = f"{cls.name}|{checkpoint.path}|{k}|{packed_like(net, target)}"
        return cls(net, target, k, cache_key=key, cuda_graphs=graphs)

    def new_drafter(self, capacity: int) -> Eagle3Drafter:
        return Eagle3Drafter(self, capacity)


class Eagle3Drafter(ResidentDrafter):
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
        # a sampled chain's races, every draft position's, refilled before each draft
        self._noise = torch.empty(self.max_draft_tokens, self.net.args.draft_vocab, device=device)
        # the fixed-shape chains as CUDA graphs (graphs on); else run as they are, by the
        # device-resident loop
        self.steps = StepGraphs(self.build_step, on=method.cuda_graphs)

    def build_step(self, key: object, capture: bool) -> ChainSteps:
        """The fixed-shape chains (methods/eagle3/chain.py): one object keeps a chain per
        length and sampling setting, so there is one key."""
        fixed = partial(chain, self.net, self.target, self.cache, self.fused)
        return ChainSteps(fixed, self.net, self.cache, self._noise, capture)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.net.parameters(), self.cache.k, self.cache.v, self.fused]

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)
        # entry i needs token i + 1: keep those whose next token is still committed
        self.cache.rollback(min(self.cache.length, max(self.length - 1, 0)))

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        n, t = self.length, len(tokens)
        self.fused[:, n : n + t] = self.net.project(self._features(taps))
        self.ids[0, n : n + t] = torch.tensor(tokens, device=self.ids.device)
        self.length = n + t

    def _features(self, taps: Mapping[int, torch.Tensor]) -> torch.Tensor:  # [1, T, K*Ht]
        return torch.cat([taps[i] for i in self.taps], dim=-1)

    def _sampling(
        self, params: SamplingParams | None, generator: torch.Generator | None
    ) -> SamplingParams | None:
        """The params of a sampled chain, its races drawn first (every position's, so the
        generator advances alike in every path); None for a greedy one."""
        if params is None or params.greedy or generator is None:
            return None
        self._noise.exponential_(generator=generator)
        return params

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
        sampling = self._sampling(params, generator)
        if self.steps.on:  # graphs on: the waiting entries, then the chain's graph
            self._settle()
            return self._fixed(anchor, self.length, k, sampling)
        net, target, cache, n = self.net, self.target, self.cache, self.length
        c = cache.length  # entries 0..c-1 committed; c..n-1 wait (n-1 pairs with the anchor)
        anchor_t = torch.tensor([[anchor]], device=self.ids.device)
        ids = torch.cat([self.ids[:, c + 1 : n], anchor_t], dim=1)
        hidden = net(target, ids, self.fused[:, c:n], cache)[:, -1:]
        tokens, dists = [], []
        for j in range(k):
            noise = None if sampling is None else self._noise[j : j + 1]
            logits = net.logits(target, hidden[:, -1])
            token, q = pick(net, logits, sampling, noise, target.args.vocab_size)
            tokens.append(token)
            dists.append(q)
            if j + 1 < k:
                hidden = net(target, token, hidden, cache)
        cache.rollback(n - 1)  # the anchor's entry and the chain's are not committed
        probs = None if sampling is None else torch.stack(dists, dim=1)
        return Draft(tokens=torch.cat(tokens, dim=1), probs=probs)

    def _settle(self) -> None:
        """Commit every entry whose next token is known (up to n - 2): what a fixed-shape
        chain expects to find in the cache."""
        c, n = self.cache.length, self.length
        if c < n - 1:
            self.net(self.target, self.ids[:, c + 1 : n], self.fused[:, c : n - 1], self.cache)

    def _fixed(
        self,
        anchor: int | torch.Tensor,
        start: int | torch.Tensor,
        k: int,
        sampling: SamplingParams | None,
    ) -> Draft:
        """The chain from the fixed-shape step: a graph replay with graphs on (eager from
        the first failed capture on, with the same output), else run as it is."""
        return self.steps(CHAINS, anchor, start, k, sampling)

    # The device-resident loop (engine/resident.py): lengths and the anchor on the device.

    def begin_resident(self) -> None:
        self.cache.make_finite()  # the masked attention reads dead positions (weighted by 0)
        self._settle()

    @torch.inference_mode()
    def draft_at(
        self,
        anchor: torch.Tensor,  # [1, 1] int64 on the device
        start: torch.Tensor,  # [1] int64 on the device: the committed length
        k: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        """`propose` from device state: the cache holds entries up to start - 2."""
        return self._fixed(anchor, start, k, self._sampling(params, generator))

    @torch.inference_mode()
    def observe_at(
        self, tokens: torch.Tensor, taps: Mapping[int, torch.Tensor], start: torch.Tensor
    ) -> None:
        """The verified block [anchor, d_1..d_l] at `start`: its features and tokens, and
        its entries start - 1 .. start + l - 1 (each position's features with the block
        token after it), of which those up to the accepted drafts stay."""
        t = tokens.shape[1]
        positions = start + torch.arange(t, device=start.device)
        self.fused.index_copy_(1, positions, self.net.project(self._features(taps)))
        self.ids.index_copy_(1, positions, tokens)
        entries = positions - 1
        hidden = self.fused.index_select(1, entries)
        self.net.forward_static(self.target, tokens, hidden, self.cache, entries[:1])

    def assume(self, length: int) -> None:
        self.length = length
        self.cache.assume_written(max(length - 1, 0))  # entries whose next token is in
