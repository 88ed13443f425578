"""The commit step every decoding loop shares: which of a step's tokens the answer keeps,
and why it ends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specgen.core.errors import ContextLimitError


def cut(tokens: list[int], produced: int, limit: int, stop_ids: frozenset[int]):
    """The part of `tokens` to emit after `produced` tokens, and why the answer ends
    (None: it goes on): at a stop token (not emitted) or at `limit` tokens."""
    for i, token in enumerate(tokens):
        if token in stop_ids:
            return tokens[:i], "stop"
        if produced + i + 1 == limit:
            return tokens[: i + 1], "length"
    return tokens, None


@dataclass
class Answer:
    """An answer as the loops commit it, step by step."""

    limit: int  # max_new_tokens
    stop_ids: frozenset[int]
    produced: int = 0  # tokens committed so far

    @property
    def room(self) -> int:
        """Tokens still to come after the next one (the most a draft can add)."""
        return self.limit - self.produced - 1

    def commit(self, tokens: list[int], free: int) -> tuple[tuple[int, ...], str | None]:
        """`tokens` (accepted drafts, then the bonus) cut as the answer allows, and why it
        ends; `free`: cache positions left for the next anchor (0: it ends at "context")."""
        kept, finish = cut(tokens, self.produced, self.limit, self.stop_ids)
        self.produced += len(kept)
        if finish is None and free == 0:
            finish = "context"
        return tuple(kept), finish


def reported(step: list[int], kept: tuple[int, ...], finish: str | None) -> list[int]:
    """The tokens whose logprobs a step reports: those it kept, and the stop token that
    ended the answer (not part of it, but chosen at its position: vLLM and OpenAI report
    it too, and lm-eval counts on one entry per new token)."""
    return step[: len(kept) + (finish == "stop")]


def reusable_prefix(held: Sequence[int], prompt_ids: Sequence[int], capacity: int) -> int:
    """How much of a cache holding `held` a new prompt keeps: the prefix they share, leaving
    at least one token to prefill (its logits give the first new token). A prompt that
    leaves no room for one new token is refused."""
    if len(prompt_ids) >= capacity:
        raise ContextLimitError(
            f"prompt is {len(prompt_ids)} tokens but the context limit is "
            f"{capacity} (leave room for at least one new token; see --context)"
        )
    keep, limit = 0, min(len(held), len(prompt_ids) - 1)
    while keep < limit and held[keep] == prompt_ids[keep]:
        keep += 1
    return keep
