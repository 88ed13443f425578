"""Plain autoregressive decoding: the baseline every method is measured and checked against.

One target forward per token, in the same engine and cache as the speculative methods, so
speedups compare like with like. The loop yields one `StepEvent` per committed token and
stops exactly at a stop token (not emitted), at `max_new_tokens`, or at the context limit.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

from specgen.core.config import SamplingParams
from specgen.core.events import StepEvent
from specgen.engine.answer import Answer, reported
from specgen.engine.prefill import prefill_forward
from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import Transformer
from specgen.verify.constraint import Constraint, masked
from specgen.verify.logprobs import logprobs_of
from specgen.verify.penalties import Penalties, penalised
from specgen.verify.sampling import make_generator, sample


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
    history: Sequence[int] = (),
    constraint: Constraint | None = None,
    cancel: Callable[[], bool] | None = None,
) -> Iterator[StepEvent]:
    """Prefill `new_ids` after what `cache` already holds (`history`: those tokens, which
    the repetition penalty counts as prompt), then decode token by token.

    `lookahead` (default: on CUDA) enqueues the forward of token N before the host reads
    token N back, so the device computes step N+1 while the host waits for, checks and
    hands over token N: no device idle between steps. A stop token is then found one step
    late; its forward is undone (`rollback`), so the cache ends exactly as without
    lookahead. On the CPU every op runs to completion before returning, so there it
    would only add a wasted forward after a stop token (and with a `constraint`, which
    must see token N before the mask of N+1, it is off).

    `constraint` masks every row (verify/constraint.py); `cancel` is asked between
    prefill chunks (engine/prefill.py)."""
    if lookahead is None:
        lookahead = model.device.type == "cuda" and constraint is None
    generator = make_generator(params, model.device)
    answer = Answer(max_new_tokens, stop_ids)
    logits = prefill_forward(model, cache, new_ids, cancel=cancel).logits[:, -1]  # [1, V]
    penalties = Penalties.start(params, [*history, *new_ids], logits)
    token = sample(masked(constraint, penalised(penalties, logits)), params, generator)
    while True:
        if penalties is not None:  # counted before the next token is chosen
            penalties.count(token)
        ahead = None
        if lookahead and answer.room > 0 and cache.free > 0:
            ahead = model(token.view(1, 1), cache).logits[:, -1]  # queued behind the sample
        tid = int(token)  # sync: the host needs the token to stop, detokenize and stream
        # without lookahead the token's K/V still needs a place in the cache
        committed, finish = answer.commit([tid], cache.free if ahead is None else 1)
        if finish == "stop" and ahead is not None:  # the stop token's forward ran ahead
            cache.rollback(cache.length - 1)
        if constraint is not None:
            constraint.commit(committed)
        logprobs = logprobs_of(logits, reported([tid], committed, finish), params.logprobs)
        yield StepEvent(tokens=committed, finish=finish, bonus=tid, logprobs=logprobs)
        if finish is not None:
            return
        if ahead is None:
            ahead = model(token.view(1, 1), cache).logits[:, -1]
        logits = ahead
        token = sample(masked(constraint, penalised(penalties, logits)), params, generator)
