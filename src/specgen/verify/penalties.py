"""Presence, frequency and repetition penalties on the target's logits, at every position a
step verifies exactly as plain decoding applies them.

Definitions are vLLM's (`apply_penalties`), which are OpenAI's for the first two and
transformers' / llama.cpp's for the third:
- repetition_penalty r (1: off), over every token of the prompt and of the answer so far:
  a positive logit is divided by r, any other multiplied by r (transformers'
  `RepetitionPenaltyLogitsProcessor` reads prompt + answer too);
- frequency_penalty f: minus f times the number of times the token is in the answer so far;
- presence_penalty p: minus p if the token is in the answer so far at all.
The last two count the answer only, not the prompt (OpenAI's, vLLM's; llama.cpp's server
counts a window of the last 64 tokens instead). They apply to the raw logits, before
temperature, top-k and top-p, as in vLLM and transformers.

A verify pass over [anchor, d1..dk] yields k+1 rows; row j is the distribution of the token
after d_j, so it is penalised as if the answer so far ended with d1..dj: what plain decoding
would have used had d1..dj been its tokens. Row j only decides anything once d1..dj are
accepted, so every committed token is drawn from (or is the argmax of) exactly the row plain
decoding would have drawn it from, and greedy output stays token for token AR's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specgen.core.config import SamplingParams


class Penalties:
    """One answer's penalty state on the device: which tokens its prompt holds and how often
    each is in its answer so far. Updated from device tensors only (no host sync), so the
    device-resident loop can run ahead of the host."""

    def __init__(
        self, params: SamplingParams, prompt_ids: Sequence[int], vocab: int, device: torch.device
    ) -> None:
        self.params = params
        self.in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)  # [V]
        if len(prompt_ids):
            self.in_prompt[torch.tensor(list(prompt_ids), device=device)] = True
        self.counts = torch.zeros(vocab, device=device)  # [V] fp32: times in the answer

    @classmethod
    def start(
        cls, params: SamplingParams, prompt_ids: Sequence[int], logits: torch.Tensor
    ) -> Penalties | None:
        """The state for an answer after `prompt_ids` (None when no penalty is asked for);
        `logits` [..., V] only give the vocabulary and the device."""
        if not params.penalised:
            return None
        return cls(params, prompt_ids, logits.shape[-1], logits.device)

    def apply(
        self,
        logits: torch.Tensor,  # [T, V]: rows of one sequence, row j after drafts[:j]
        drafts: torch.Tensor | None = None,  # [T-1] the tokens between the rows
    ) -> torch.Tensor:  # [T, V] fp32
        rows, vocab = logits.shape
        counts = self.counts.expand(rows, vocab)
        if drafts is not None and drafts.numel():
            added = torch.zeros(rows, vocab, device=logits.device)
            added[1:].scatter_(1, drafts.view(-1, 1).to(logits.device), 1.0)
            counts = counts + added.cumsum(0)  # row j: the answer plus d1..dj
        return penalise(logits.float(), counts, self.in_prompt, self.params)

    def commit(
        self,
        drafts: torch.Tensor,  # [k] the step's verified drafts
        accepted: int | torch.Tensor,  # how many of them were committed (a device scalar ok)
        bonus: torch.Tensor,  # [1] the target's own token
    ) -> None:
        """Count a step's committed tokens: its first `accepted` drafts and the bonus."""
        if drafts.numel():
            kept = torch.arange(drafts.numel(), device=self.counts.device) < accepted
            self.counts.index_add_(0, drafts.view(-1).to(self.counts.device), kept.float())
        self.count(bonus)

    def count(self, tokens: torch.Tensor) -> None:
        """Count `tokens` [n] as committed to the answer."""
        tokens = tokens.view(-1).to(self.counts.device)
        self.counts.index_add_(0, tokens, torch.ones(tokens.numel(), device=self.counts.device))


def penalise(
    logits: torch.Tensor,  # [..., V] fp32
    counts: torch.Tensor,  # [..., V] times each token is in the answer so far
    in_prompt: torch.Tensor,  # [V] bool
    params: SamplingParams,
) -> torch.Tensor:
    """The three penalties on `logits`, in vLLM's order (repetition first)."""
    seen = counts > 0
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        scaled = torch.where(logits > 0, logits / r, logits * r)
        logits = torch.where(seen | in_prompt, scaled, logits)
    if params.frequency_penalty:
        logits = logits - params.frequency_penalty * counts
    if params.presence_penalty:
        logits = logits - params.presence_penalty * seen.float()
    return logits


def penalised(
    penalties: Penalties | None,
    logits: torch.Tensor,  # [1, T, V] or [1, V]
    drafts: torch.Tensor | None = None,  # [1, T-1]
) -> torch.Tensor:
    """What the loops sample and verify from: `logits` as they are without penalties, else
    penalised row by row (one sequence: batch 1)."""
    if penalties is None:
        return logits
    if logits.dim() == 2:  # [1, V]: one row
        return penalties.apply(logits)
    return penalties.apply(logits[0], None if drafts is None else drafts[0])[None]
