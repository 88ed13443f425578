"""The MTP draft chain with fixed shapes, for the device-resident loop and CUDA graphs.

A chain of k drafts is the anchor's entry (the target's hidden state at the last committed
position with the anchor, at RoPE position start - 1) and k - 1 chain entries, each the
previous entry's output with the token it drafted (the one MTP layer applied again, as
vLLM and llama.cpp do past the checkpoint's layer count). `start` (the committed length)
and the anchor are read from device memory, so a chain of k drafts is a fixed sequence of
device ops: a CUDA graph per k and sampling setting, or run as it is (the CPU). Entries it
writes past the committed ones are dead once it returns; `observe_at` writes the next.

A token is the argmax of the target's head over the entry's output, or a draw from q = the
request's sampling filters over those logits, an exponential race over noise drawn before
the chain, so a sampled chain is fixed device ops too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft
from specgen.verify.sampling import probabilities

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams
    from specgen.methods.mtp.network import MtpNet
    from specgen.models.cache.kv import StaticKVCache
    from specgen.models.transformer import Transformer


def pick(
    logits: torch.Tensor,  # [1, V]
    params: SamplingParams | None,  # None: greedy
    noise: torch.Tensor | None,  # [1, V] Exp(1), a sampled pick's race
) -> tuple[torch.Tensor, torch.Tensor | None]:  # the token [1, 1], q [1, V]
    if params is None or noise is None:
        return logits.argmax(dim=-1).view(1, 1), None
    q = probabilities(logits, params)
    return (q / noise).argmax(dim=-1).view(1, 1), q  # a draw from q: argmax of q_i / E_i


def chain(
    net: MtpNet,
    target: Transformer,
    cache: StaticKVCache,
    hiddens: torch.Tensor,  # [1, capacity, H] every committed position's target hidden
    anchor: torch.Tensor,  # [1, 1] int64 on the device
    start: torch.Tensor,  # [1] int64 on the device: the committed length (>= 1)
    k: int,
    params: SamplingParams | None,
    noise: torch.Tensor | None,  # [>= k, V] for a sampled chain
) -> Draft:
    """k drafts after `anchor` from device state; entries before start - 1 must be in
    `cache` (the drafter's invariant between steps)."""
    at = start - 1  # the anchor's entry: the last committed position's hidden state
    hidden = net.forward_static(target, anchor, hiddens.index_select(1, at), cache, at)
    tokens, dists = [], []
    for j in range(k):
        row = None if noise is None else noise[j : j + 1]
        token, q = pick(net.logits(target, hidden[:, -1]), params, row)
        tokens.append(token)
        dists.append(q)
        if j + 1 < k:
            hidden = net.forward_static(target, token, hidden, cache, start + j)
    probs = None if dists[0] is None else torch.stack(dists, dim=1)  # [1, k, V]
    return Draft(tokens=torch.cat(tokens, dim=1), probs=probs)
