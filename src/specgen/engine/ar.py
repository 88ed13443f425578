"""Plain autoregressive decoding: the baseline every method is measured and checked against.

One target forward per token, in the same engine and cache as the speculative methods, so
speedups compare like with like. The loop yields one `StepEvent` per committed token and
stops exactly at a stop token (not emitted), at `max_new_tokens`, or at the context limit.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from specgen.config import SamplingParams
from specgen.engine.events import StepEvent
from specgen.engine.sampling import make_generator, sample
from specgen.models.kv_cache import StaticKVCache
from specgen.models.transformer import Transformer


@torch.inference_mode()
def generate_ar(
    model: Transformer,
    cache: StaticKVCache,
    new_ids: list[int],
    *,
    params: SamplingParams,
    max_new_tokens: int,
    stop_ids: frozenset[int],
    lookahead: bool | None = None,
) -> Iterator[StepEvent]:
    """Prefill `new_ids` after what `cache` already holds, then decode token by token.

    `lookahead` (default: on CUDA) enqueues the forward of token N before the host reads
    token N back, so the device computes step N+1 while the host waits for, checks and
    hands over token N: no device idle between steps. A stop token is then found one step
    late; its forward is undone (`rollback`), so the cache ends exactly as without
    lookahead. On the CPU every op runs to completion before returning, so there it
    would only add a wasted forward after a stop token."""
    if lookahead is None:
        lookahead = model.device.type == "cuda"
    generator = make_generator(params, model.device)
    tokens = torch.tensor([new_ids], dtype=torch.long, device=model.device)
    logits = model(tokens, cache, num_logits=1).logits[:, -1]
    token = sample(logits, params, generator)
    for produced in range(1, max_new_tokens + 1):
        ahead = None
        if lookahead and produced < max_new_tokens and cache.free > 0:
            ahead = model(token.view(1, 1), cache).logits[:, -1]  # queued behind the sample
        tid = int(token)  # sync: the host needs the token to stop, detokenize and stream
        if tid in stop_ids:
            if ahead is not None:  # the stop token's forward ran ahead: undo it
                cache.rollback(cache.length - 1)
            yield StepEvent(tokens=(), finish="stop", bonus=tid)
            return
        if produced == max_new_tokens:
            yield StepEvent(tokens=(tid,), finish="length", bonus=tid)
            return
        if cache.free == 0 and ahead is None:  # nowhere to put this token's K/V
            yield StepEvent(tokens=(tid,), finish="context", bonus=tid)
            return
        yield StepEvent(tokens=(tid,), bonus=tid)
        if ahead is None:
            ahead = model(token.view(1, 1), cache).logits[:, -1]
        token = sample(ahead, params, generator)
