"""EAGLE-3's draft chain with fixed shapes, for the device-resident loop and CUDA graphs.

A chain of k drafts is the anchor's entry (the features of the last committed position
with the anchor, at RoPE position start - 1) and k - 1 chain entries, each the previous
entry's hidden output with the token it drafted. Here `start` (the committed length) and
the anchor are read from device memory and every entry runs `Eagle3Net.forward_static`,
so one chain of k drafts is a fixed sequence of device ops: captured once per k (and per
sampling setting) as a CUDA graph and replayed at any length, or run as it is (`capture`
False: the CPU, and graphs off). The entries it writes past the committed ones are dead
the moment it returns; the next step's `observe_at` writes the committed ones.

A token is picked from the drafter's logits (draft indices, mapped to target ids): the
argmax, or a draw from q = the request's sampling filters over the logits, as an
exponential race over noise the drafter draws before the chain, so the sampled chain is
fixed device ops too. q goes to the verifier scattered into the target's vocabulary.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from specgen.core.draft import Draft
from specgen.verify.sampling import probabilities

if TYPE_CHECKING:
    from specgen.core.config import SamplingParams
    from specgen.methods.eagle3.network import Eagle3Net
    from specgen.models.cache.kv import StaticKVCache
    from specgen.models.transformer import Transformer


def pick(
    net: Eagle3Net,
    logits: torch.Tensor,  # [1, V'] over the draft vocabulary
    params: SamplingParams | None,  # None: greedy
    noise: torch.Tensor | None,  # [1, V'] Exp(1), a sampled pick's race
    vocab: int,  # the target's vocabulary, which q is scattered into
) -> tuple[torch.Tensor, torch.Tensor | None]:  # the token [1, 1] (target id), q [1, V]
    if params is None or noise is None:
        return net.to_target[logits.argmax(dim=-1)].view(1, 1), None
    q = probabilities(logits, params)
    index = (q / noise).argmax(dim=-1)  # a draw from q: argmax of q_i / E_i
    if q.shape[-1] != vocab:  # a draft vocabulary: q is 0 on every other target token
        q = q.new_zeros(1, vocab).index_copy_(1, net.to_target, q)
    return net.to_target[index].view(1, 1), q


def chain(
    net: Eagle3Net,
    target: Transformer,
    cache: StaticKVCache,
    fused: torch.Tensor,  # [1, capacity, H] every committed position's fc output
    anchor: torch.Tensor,  # [1, 1] int64 on the device
    start: torch.Tensor,  # [1] int64 on the device: the committed length (>= 1)
    k: int,
    params: SamplingParams | None,
    noise: torch.Tensor | None,  # [>= k, V'] for a sampled chain
) -> Draft:
    """k drafts after `anchor` from device state; entries before start - 1 must be in
    `cache` (the drafter's invariant between steps)."""
    vocab = target.args.vocab_size
    at = start - 1  # the anchor's entry: the last committed position's features
    hidden = net.forward_static(target, anchor, fused.index_select(1, at), cache, at)
    tokens, dists = [], []
    for j in range(k):
        row = None if noise is None else noise[j : j + 1]
        token, q = pick(net, net.logits(target, hidden[:, -1]), params, row, vocab)
        tokens.append(token)
        dists.append(q)
        if j + 1 < k:
            hidden = net.forward_static(target, token, hidden, cache, start + j)
    probs = None if dists[0] is None else torch.stack(dists, dim=1)  # [1, k, V]
    return Draft(tokens=torch.cat(tokens, dim=1), probs=probs)
