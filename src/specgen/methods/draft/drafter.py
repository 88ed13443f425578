"""`--method draft` (`--draft-model`): a smaller causal LM of the target's tokenizer drafts
a chain of k tokens autoregressively (llama.cpp's draft-simple / `-md`, vLLM's
`draft_model`, transformers' assisted generation).

The draft model is any model specgen loads as a target (methods/draft/model.py) and keeps
its own KV cache. Its context follows the target's committed tokens lazily: `observe`
and `rollback` only edit the token list, and `propose` first rolls the cache back to the
longest prefix it holds of [committed tokens, anchor], then runs the rest in one forward.
So the anchor and the drafts the target accepted keep the K/V the chain computed for
them (a row's result never depends on the other rows of its forward, so reusing them is
exact), and a rejected draft's K/V is forgotten before anything reads it.

k is the verify length the cost scheduler settled before drafting (the drafter has no
confidences), priced by the draft model's measured step times like any drafter's. Greedy
drafts are the argmax chain (a point mass). Sampling draws each draft from the draft
model's distribution under the request's filters (temperature, top-k, top-p) with the
request's generator, and hands that q to the shared verifier, whose rejection sampling
keeps the target's distribution.

The draft model's context limit is its own: where [context, anchor, drafts] would not
fit, it drafts fewer tokens, then none, and the target decodes alone from there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft, DraftOption, empty_draft
from specgen.core.errors import SpecgenError
from specgen.drafting.base import DRAFTERS, Checkpoint, Drafter, DraftMethod, register
from specgen.methods.draft.export import EXPORT
from specgen.methods.draft.model import (
    DraftModel,
    fit_vocabulary,
    is_model_source,
    load_draft_model,
    locate_model,
)
from specgen.methods.draft.pairing import pairings
from specgen.models.families import model_args
from specgen.verify.sampling import probabilities

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams, SpecConfig
    from specgen.models.transformer import Transformer

DEFAULT_DRAFT_TOKENS = 8  # the longest chain; the scheduler verifies what pays


@register("draft")
class DraftModelMethod(DraftMethod):
    export = EXPORT
    label = "draft model"

    def __init__(self, draft: DraftModel, vocab: int, draft_tokens: int) -> None:
        self.draft = draft
        self.vocab = vocab  # the target's: drafts are its ids, q is over them
        self.max_draft_tokens = draft_tokens
        self.cache_key = f"{self.name}|{draft.source}|{draft.model.weights_identity}|{draft_tokens}"

    @classmethod
    def claims(cls, config: dict) -> bool:
        """A whole causal LM specgen runs as a target, which no other method claims (a
        SafeAILab EAGLE-3 checkpoint also says LlamaForCausalLM)."""
        if any(c.claims(config) for c in DRAFTERS.values() if c is not cls):
            return False
        try:
            model_args(config)
        except (SpecgenError, KeyError, TypeError, ValueError):
            return False
        return True

    @classmethod
    def locate(cls, source: str) -> Path | None:
        """A model named by alias or GGUF file (a model's directory with config.json is
        found like any drafter checkpoint)."""
        return locate_model(source) if is_model_source(source) else None

    @classmethod
    def pairs(cls, models: Mapping[str, Path]) -> Mapping[str, Sequence[str]]:
        return pairings(models)

    @classmethod
    def load(
        cls,
        target: Transformer,
        spec: SpecConfig,
        checkpoints: Sequence[Checkpoint],
        *,
        target_name: str,
        notify: Callable[[str], None] | None = None,
    ) -> DraftModelMethod:
        if len(checkpoints) != 1:
            raise SpecgenError(f"no draft model given for {target_name}; pass --draft-model")
        draft = load_draft_model(checkpoints[0], target, target_name, notify)
        k = spec.draft_tokens or DEFAULT_DRAFT_TOKENS
        return cls(draft, target.args.vocab_size, k)

    def new_drafter(self, capacity: int) -> DraftModelDrafter:
        return DraftModelDrafter(self, capacity)


class DraftModelDrafter(Drafter):
    taps: tuple[int, ...] = ()  # it reads tokens only, none of the target's features
    options = (DraftOption(),)  # one kind of draft; the scheduler settles its length

    def __init__(self, method: DraftModelMethod, capacity: int) -> None:
        self.model = method.draft.model
        self.vocab = method.vocab
        self.max_draft_tokens = method.max_draft_tokens
        limit = self.model.args.max_positions  # its own context, maybe below the target's
        self.cache = self.model.new_cache(min(limit, capacity + self.max_draft_tokens + 1))
        self.context: list[int] = []  # the target's committed tokens
        self.held: list[int] = []  # the tokens whose K/V the cache holds, in order
        # how many leading tokens of `held` are known to be the context's (so a step
        # compares only the few after them: the anchor and the chain it drafted last)
        self.agreed = 0

    def tensors(self) -> list[torch.Tensor]:
        return [*self.model.tensors(), *self.cache.tensors()]

    def rollback(self, length: int) -> None:
        del self.context[length:]
        self.agreed = min(self.agreed, length)

    def observe(self, tokens: Sequence[int], taps: Mapping[int, torch.Tensor]) -> None:
        self.context.extend(int(t) for t in tokens)

    def _settle(self, sequence: list[int]) -> int:
        """Roll the cache back to the longest prefix of `sequence` it holds, leaving at
        least one token to run (whose logits the first draft needs); that length."""
        limit = min(len(self.held), len(sequence) - 1)
        keep = min(self.agreed, limit)
        while keep < limit and self.held[keep] == sequence[keep]:
            keep += 1
        self.cache.rollback(min(keep, self.cache.length))
        del self.held[keep:]
        return keep

    @torch.inference_mode()
    def propose(
        self,
        anchor: int,
        max_tokens: int,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
    ) -> Draft:
        device = self.model.device
        sequence = [*self.context, anchor]
        # draft j (1..k) is run at position len(sequence) + j - 1 unless it is the last
        k = min(max_tokens, self.max_draft_tokens, self.cache.capacity - len(sequence) + 1)
        if k <= 0:
            return empty_draft(device)  # past its own context
        keep = self._settle(sequence)
        if max(sequence[keep:]) >= self.model.args.vocab_size:
            return empty_draft(device)  # an id it has no embedding for (the target's padding)
        ids = torch.tensor([sequence[keep:]], dtype=torch.long, device=device)
        logits = self.model(ids, self.cache, num_logits=1).logits[:, -1]  # [1, Vd]
        self.held, self.agreed = sequence, len(self.context)
        sampled = not (params is None or params.greedy or generator is None)
        tokens, dists = [], []
        for j in range(k):
            logits = fit_vocabulary(logits, self.vocab)  # [1, V]
            if sampled:
                q = probabilities(logits, params)
                token = torch.multinomial(q, 1, generator=generator)  # [1, 1]
                dists.append(q)
            else:
                token = logits.argmax(dim=-1, keepdim=True)  # [1, 1]
            tokens.append(token)
            if j + 1 < k:
                logits = self.model(token, self.cache).logits[:, -1]
        drafted = torch.cat(tokens, dim=1)  # [1, k]
        self.held += drafted[0, : k - 1].tolist()  # sync: the host keeps what the cache holds
        probs = torch.stack(dists, dim=1) if sampled else None  # [1, k, V]
        return Draft(tokens=drafted, probs=probs)
