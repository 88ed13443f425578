"""What a stream of an answer yields and what a finished answer is, torch-free: the
pipeline's streams, the fast start of `generate` (api/quick.py) and the CLI's records
share them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specgen.core.events import StepEvent, TokenLogprob
from specgen.core.stats import GenStats
from specgen.text.codec import Detokenizer

Prompt = str | list[dict[str, str]]  # text, or a chat conversation


@dataclass(frozen=True)
class Chunk:
    """One step of a stream: the text it added and the tokens it committed."""

    text: str
    token_ids: tuple[int, ...]
    stats: GenStats  # running totals; final once stats.finish_reason is set
    draft_chars: int = 0  # text[:draft_chars] came from accepted draft tokens
    # with SamplingParams.logprobs: one per token (and one more for the stop token that
    # ended the answer, if one did), and the text each token added (joined: `text`; a
    # token that ends a character spelled over several adds it whole)
    logprobs: tuple[TokenLogprob, ...] = ()
    token_text: tuple[str, ...] = ()


@dataclass(frozen=True)
class Completion:
    prompt: Prompt
    text: str
    token_ids: list[int]
    stats: GenStats
    logprobs: list[TokenLogprob] | None = None  # with SamplingParams.logprobs (see Chunk)

    def to_dict(self) -> dict[str, Any]:
        record = {
            "prompt": self.prompt,
            "text": self.text,
            "token_ids": self.token_ids,
            "stats": self.stats.to_dict(),
        }
        if self.logprobs is not None:
            record["logprobs"] = [
                {"token": t.token, "logprob": t.logprob, "top": [list(p) for p in t.top]}
                for t in self.logprobs
            ]
        if self.stats.trace is not None:
            record["trace"] = self.stats.trace
        return record


def chunk_of(event: StepEvent, detok: Detokenizer, stats: GenStats) -> Chunk:
    """A step's text: accepted drafts first, then the target's own token, so views can
    colour them apart. With logprobs, token by token, so each token's text is known."""
    drafts = min(event.accepted, len(event.tokens))
    if event.logprobs:
        pieces = [detok.push([token]) for token in event.tokens]
        tail = detok.flush() if event.finish is not None else ""
        if pieces:  # the held end of a character belongs to the last token
            pieces[-1], tail = pieces[-1] + tail, ""
        drafted = sum(len(p) for p in pieces[:drafts])
        text = "".join(pieces) + tail
        return Chunk(text, event.tokens, stats, drafted, event.logprobs, tuple(pieces))
    drafted_text = detok.push(list(event.tokens[:drafts])) if drafts else ""
    text = drafted_text + detok.push(list(event.tokens[drafts:]))
    if event.finish is not None:
        text += detok.flush()
    return Chunk(text, event.tokens, stats, draft_chars=len(drafted_text))
