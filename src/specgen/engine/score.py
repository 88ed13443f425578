"""Scoring a prompt: the target's logprob of each of its tokens given the ones before it
(OpenAI's `echo` with `logprobs`, what lm-eval's loglikelihood tasks ask for).

It is a prefill that keeps every position's logits, so nothing cached can be reused (a
cached position has no logits left): the session starts empty and ends holding the whole
prompt, as an answer's prefill leaves it, so an answer to the same prompt right after
prefills only its last token. Logits are kept a block of rows at a time ([rows, V] fp32
each), so a long prompt never holds [T, V] at once.
"""

from __future__ import annotations

import torch

from specgen.core.events import TokenLogprob
from specgen.engine.session import Session
from specgen.models.cache.kv import ContextLimitError
from specgen.verify.logprobs import row_logprobs

ROWS = 512  # prompt tokens per forward while scoring


@torch.inference_mode()
def score_prompt(session: Session, prompt_ids: list[int], top: int) -> list[TokenLogprob]:
    """`prompt_ids[1:]`'s logprobs (the first token has nothing before it), each with the
    `top` likeliest tokens at its position."""
    if len(prompt_ids) >= session.capacity:
        raise ContextLimitError(
            f"prompt is {len(prompt_ids)} tokens but the context limit is "
            f"{session.capacity} (leave room for at least one new token; see --context)"
        )
    session.reset()
    drafter = session.drafter
    taps = drafter.taps if drafter is not None else ()
    scored: list[TokenLogprob] = []
    try:
        for start in range(0, len(prompt_ids), ROWS):
            block = prompt_ids[start : start + ROWS]
            ids = torch.tensor([block], device=session.device)
            out = session.forward(ids, session.cache, taps=taps, num_logits=len(block))
            if drafter is not None:  # its context mirrors the cache, as after a prefill
                drafter.observe(block, out.taps)
            after = prompt_ids[start + 1 : start + 1 + len(block)]  # what each row predicts
            if after:
                rows = row_logprobs(out.logits[0, : len(after)], torch.tensor(after), top)
                scored += rows.tokens(after)
    except BaseException:
        session.reset()  # half a prompt: nothing in the cache can be trusted to name
        raise
    session.settle(prompt_ids)
    return scored
