"""A prompt's prefill, in chunks, with a chance to stop between them.

One forward over a 6 000-token prompt held the server's worker for minutes after its
client had left. In chunks of `CHUNK` tokens, `cancel()` is asked before each; when it
says stop, `Cancelled` is raised with the cache (and the drafter's context, which
observes each chunk) holding exactly the chunks done, so the session settles to them and
a retry of the same prompt reuses them. The first chunk takes the remainder, so the last
is whole: a hybrid target snapshots its state a few tokens before a prefill's end, which
a short last chunk would leave out. A prompt up to `CHUNK` tokens is one forward, as
before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specgen.core.errors import Cancelled
from specgen.models.cache.kv import StaticKVCache
from specgen.models.transformer import ForwardOutput

CHUNK = 512  # tokens per prefill forward: a few seconds at most on two CPU cores
# Tokens per prefill chunk where answers share one fused pass (api/streams.py): there a
# row's bits do not depend on its chunk, and a step waits for the whole chunk, so a request
# sent while long prompts were read in 512-row chunks waited ~0.45 s on two cores for its
# first token; 64 rows are a step of 50-90 ms, and read a prompt within ~5% of the time
# 512-row chunks take (1,500 tokens: 1.85 s against 1.82 s; 128 rows took 1.76 s).
SHARED_CHUNK = 64


def bounds(n: int, size: int = CHUNK) -> list[tuple[int, int]]:
    """[start, end) of each chunk of `n` tokens: the first takes the remainder."""
    first = n % size or min(n, size)
    out = [(0, first)]
    while out[-1][1] < n:
        start = out[-1][1]
        out.append((start, start + size))
    return out


@torch.inference_mode()
def prefill_forward(
    model,
    cache: StaticKVCache,
    new_ids: Sequence[int],
    *,
    taps: tuple[int, ...] = (),
    observe: Callable[[list[int], dict], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> ForwardOutput:
    """The last chunk's output (logits of its last position); `observe(ids, taps)` sees
    every chunk as it is computed (a drafter's context mirrors the cache)."""
    out = None
    for start, end in bounds(len(new_ids)):
        if cancel is not None and cancel():
            raise Cancelled(f"cancelled after {start} of {len(new_ids)} prompt tokens")
        ids = list(new_ids[start:end])
        out = model(torch.tensor([ids], device=model.device), cache, taps=taps, num_logits=1)
        if observe is not None:
            observe(ids, out.taps)
    assert out is not None
    return out
