"""`--method mtp`: the target's own multi-token-prediction layer drafting a chain of k
tokens (methods/mtp/network.py), as vLLM (`qwen3_5_mtp`), SGLang (NEXTN) and llama.cpp
(`draft-mtp`) run it. No drafter to download: the layer is in the target's checkpoint.

Entry i pairs the target's hidden state at position i with the token at i + 1, so an entry
can be committed only once both are in the target cache: after the target holds n tokens
the MTP cache holds entries up to n - 2 (some may wait), and entry n - 1 (whose token is
the anchor) is recomputed with every draft. A step runs the waiting entries and the
anchor's in one causal pass, then k - 1 single-entry chain steps (the layer applied again,
fed its own output and the token it drafted); the chain's K/V are dropped afterwards, and
the next step re-extends the cache from the target's hidden states of what was committed,
as the references do: the MTP cache holds, at every committed position, exactly what a
full recompute from the verified hidden states gives, whatever was accepted or rolled back.

The target's hidden state of every committed token is kept (after its final norm: what
the head reads), so a rollback to any length can rebuild the entry after it.

The device-resident loop (engine/resident.py) drives it from device state: `observe_at`
writes the verified block's hidden states and runs its entries at once (entry start - 1 + j
pairs position start - 1 + j with block token j; those past the accepted ones are
overwritten by the next step's), so a draft is a fixed-shape chain (methods/mtp/chain.py).

k is the verify length the cost scheduler settled before drafting (no confidences).
Greedy drafts are the argmax chain (a point mass); sampling draws the chain from the head's
distribution under the request's filters and hands that q to the shared verifier.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.drafting.base import Checkpoint, DraftMethod, ResidentDrafter, register
from specgen.drafting.chain_steps import ChainSteps
from specgen.drafting.packing import packed_like
from specgen.kernels.rmsnorm import rms_norm
from specgen.methods.mtp.chain import chain, pick
from specgen.methods.mtp.export import EXPORT
from specgen.methods.mtp.network import MtpNet
from specgen.methods.mtp.weights import load_mtp
from specgen.models.graphs import StepGraphs

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer


CHAINS = "chains"  # the one key of its fixed-shape steps (ChainSteps keys its own)
DEFAULT_CHAIN = 3  # the longest chain drafted unless --draft-tokens says; the scheduler trims


@register("mtp")
class MtpMethod(DraftMethod):
    needs_drafter = False  # the target's own layer; --drafter may name an MTP-only file
    drafters_needed = 0
    export = EXPORT
    label = "MTP"

    def __init__(
        self,
        net: MtpNet,
        target: Transformer,
        draft_tokens: int,
        *,
        cache_key: str = "",
        cuda_graphs: bool = False,
    ) -> None:
        self.net, self.target = net, target
        self.max_draft_tokens = draft_tokens
        self.cache_key = cache_key
        self.cuda_graphs = cuda_graphs

    @classmethod
    def claims(cls, config: dict) -> bool:
        return False  # no drafter checkpoint of its own to recognise

    @classmethod
    def mounts(cls, count: int) -> bool:
        return count <= 1  # the target's own head, or one MTP-only file

    @classmethod
    def mounts_text(cls) -> str:
        return "0 or 1"

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> MtpMethod:
        given: Path | None = checkpoints[0].path if checkpoints else None
        name = checkpoints[0].name if checkpoints else target_name
        if notify:
            notify(f"loading {cls.label} layer of {name}")
        net = load_mtp(target, given, target_name=target_name, name=name)
        k = spec.draft_tokens or DEFAULT_CHAIN
        graphs = spec.cuda_graphs and target.device.type == "cuda"
        # beside a packed CPU target its matrices are packed too (drafting/packing.py)
        key = f"{cls.name}|{given or target.source}|{k}|{packed_like(net, target)}"
        return cls(net, target, k, cache_key=key, cuda_graphs=graphs)

    def new_drafter(self, capacity: int) -> MtpDrafter:
        return MtpDrafter(self, capacity)


class MtpDrafter(ResidentDrafter):
    options = (DraftOption(),)  # one kind of draft; the scheduler settles its length

    def __init__(self, method: MtpMethod, capacity: int) -> None:
        self.net, self.target = method.net, method.target
        self.taps = (self.target.args.num_layers - 1,)  # the last layer's output
        self.max_draft_tokens = method.max_draft_tokens
        self.cache = self.net.new_cache(capacity + self.max_draft_tokens + 1)
        h, device = self.target.args.hidden_size, self.target.device
        self.hiddens = torch.empty(1, capacity, h, dtype=self.target.dtype, device=device)
        self.ids = torch.zeros(1, capacity, dtype=torch.long, device=device)
        self.length = 0  # committed target tokens this drafter follows
        vocab = self.target.args.vocab_size
        self._noise = torch.empty(self.max_draft_tokens, vocab, device=device)
        self.steps = StepGraphs(self.build_step, on=method.cuda_graphs)

    def build_step(self, key: object, capture: bool) -> ChainSteps:
        fixed = partial(chain, self.net, self.target, self.cache, self.hiddens)
        return ChainSteps(fixed, self.net, self.cache, self._noise, capture)

    def tensors(self) -> list[torch.Tensor]:
        return [*self.net.parameters(), self.cache.k, self.cache.v, self.hiddens]

    def rollback(self, length: int) -> None:
        self.length = min(self.length, length)
        # entry i needs token i + 1: keep those whose next token is still committed
        self.cache.rollback(min(self.cache.length, max(self.length - 1, 0)))

    def _hidden(self, taps: Mapping[int, torch.Tensor]) -> torch.Tensor:  # [1, T, H]
        """The target's last hidden states as its head reads them (after its final norm)."""
        t = self.target
        return rms_norm(taps[self.taps[0]], t.norm, t.args.rms_norm_eps).to(self.hiddens.dtype)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        n, t = self.length, len(tokens)
        self.hiddens[:, n : n + t] = self._hidden(taps)
        self.ids[0, n : n + t] = torch.tensor(tokens, device=self.ids.device)
        self.length = n + t

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
            return self.steps(CHAINS, anchor, self.length, k, sampling)
        net, target, cache, n = self.net, self.target, self.cache, self.length
        c = cache.length  # entries 0..c-1 committed; c..n-1 wait (n-1 pairs with the anchor)
        anchor_t = torch.tensor([[anchor]], device=self.ids.device)
        ids = torch.cat([self.ids[:, c + 1 : n], anchor_t], dim=1)
        hidden = net(target, ids, self.hiddens[:, c:n], cache)[:, -1:]
        tokens, dists = [], []
        for j in range(k):
            noise = None if sampling is None else self._noise[j : j + 1]
            token, q = pick(net.logits(target, hidden[:, -1]), sampling, noise)
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
            self.net(self.target, self.ids[:, c + 1 : n], self.hiddens[:, c : n - 1], self.cache)

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
        return self.steps(CHAINS, anchor, start, k, self._sampling(params, generator))

    @torch.inference_mode()
    def observe_at(
        self, tokens: torch.Tensor, taps: Mapping[int, torch.Tensor], start: torch.Tensor
    ) -> None:
        """The verified block [anchor, d_1..d_l] at `start`: its hidden states and tokens,
        and its entries start - 1 .. start + l - 1 (each position's hidden state with the
        block token after it), of which those up to the accepted drafts stay."""
        t = tokens.shape[1]
        positions = start + torch.arange(t, device=start.device)
        self.hiddens.index_copy_(1, positions, self._hidden(taps))
        self.ids.index_copy_(1, positions, tokens)
        entries = positions - 1
        hidden = self.hiddens.index_select(1, entries)
        self.net.forward_static(self.target, tokens, hidden, self.cache, entries[:1])

    def assume(self, length: int) -> None:
        self.length = length
        self.cache.assume_written(max(length - 1, 0))  # entries whose next token is in
