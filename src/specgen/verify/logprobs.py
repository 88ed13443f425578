"""Log-probabilities of committed tokens, from the target's own logits.

What is reported is the raw distribution: log_softmax of the target's logits at the
position, before penalties, temperature, top-k and top-p (vLLM's default `raw_logprobs`;
OpenAI's values do not move with temperature either). Every loop reads them from the same
rows it verifies with (a verify pass computes the target's logits at every verified
position: row j for the accepted d_{j+1}, or for the bonus), never from a drafter, so they
are the same with and without speculation (up to fp32 rounding of a different number of
rows in one forward).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specgen.core.events import TokenLogprob


@dataclass(frozen=True)
class RowLogprobs:
    """Log-probabilities at some rows, where they were computed (a device, until `host`)."""

    chosen: torch.Tensor  # [T] fp32: each row's chosen token
    top_values: torch.Tensor  # [T, n] fp32, likeliest first
    top_ids: torch.Tensor  # [T, n] int64

    def to_host(self, non_blocking: bool = False) -> RowLogprobs:
        """A copy on the CPU (from CUDA without waiting, into pinned memory, when asked)."""
        tensors = (self.chosen, self.top_values, self.top_ids)
        return RowLogprobs(*(t.to("cpu", non_blocking=non_blocking) for t in tensors))

    def tokens(self, tokens: Sequence[int]) -> tuple[TokenLogprob, ...]:
        """The first len(tokens) rows as `TokenLogprob`s (`tokens`: their chosen tokens)."""
        n = len(tokens)
        if n == 0:
            return ()
        # sync: logprobs were asked for; they go to the caller with the step's tokens
        chosen = self.chosen[:n].tolist()
        values, ids = self.top_values[:n].tolist(), self.top_ids[:n].tolist()
        return tuple(
            TokenLogprob(token, lp, tuple(zip(i, v, strict=True)))
            for token, lp, i, v in zip(tokens, chosen, ids, values, strict=True)
        )


def row_logprobs(
    logits: torch.Tensor,  # [T, V] raw target logits
    tokens: torch.Tensor,  # [T] the token chosen at each row
    top: int,  # likeliest tokens kept per row
) -> RowLogprobs:
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = logp.gather(-1, tokens.view(-1, 1).to(logp.device)).squeeze(-1)
    values, ids = torch.topk(logp, min(top, logp.shape[-1]), dim=-1)
    return RowLogprobs(chosen, values, ids)


def logprobs_of(
    logits: torch.Tensor,  # [T, V] raw target logits, row i for tokens[i]
    tokens: Sequence[int],
    top: int | None,
) -> tuple[TokenLogprob, ...]:
    """`tokens`' logprobs from the first len(tokens) rows (nothing when `top` is None: not
    asked for)."""
    if top is None or not tokens:
        return ()
    ids = torch.tensor(list(tokens), device=logits.device)
    return row_logprobs(logits[: len(tokens)], ids, top).tokens(tokens)
