"""Whether drafting pays in the steps several answers share, judged by those steps' own
rate, so speculation under load is never slower than no speculation for long.

The batch prices (batch.py) decide each answer's drafts from the cost table as the
forwards ran it; what they cannot see is the rest of a drafted step (drafting, judging
and committing several rows per answer on the host, on cores the server's other threads
share) and prices that are off for the batch's mix. Served to 4 clients on the 2-core CPU,
ngram ran at 0.83-0.93x AR in two rounds while every price said its drafts paid.

So a batch of a given size takes turns: an epoch of `EPOCH` shared steps with drafting as
the prices decide, one with no drafts (engine/batch.py clears each answer's `may_draft`), and
then keeps to the faster (committed tokens per second of step time, steps reading a
prompt left out), trying the other again every `EXPLORE` epochs, as the load, the
contexts and the acceptance move. Sizes are judged apart (2, 3-4, 5-8, 9 and more
answers). An answer alone is never held back: that is today's single-answer scheduler.
The decision depends on the steps' times, never on the tokens being judged, so every
answer stays what it is alone (a seeded sampling answer decides as if alone anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

EPOCH = 24  # shared steps per trial of one way
EXPLORE = 6  # every this many epochs, the way that lost is tried again
WEIGHT = 0.5  # an epoch's rate against what that way's earlier epochs showed


def size_class(answers: int) -> int:
    """2 -> 1, 3-4 -> 2, 5-8 -> 3, 9 and more -> 4 (0, 1: alone)."""
    return min(max(answers - 1, 0), 8).bit_length()


@dataclass
class _Size:
    drafting: bool = True  # the way this epoch runs
    left: int = EPOCH  # shared steps left in it
    epochs: int = 0
    tokens: int = 0  # this epoch's, steps reading a prompt left out
    seconds: float = 0.0
    rates: dict[bool, float] = field(default_factory=dict)  # tokens / s, by way


class DraftGuard:
    """Per batch: whether this step's answers may draft, by the batch's size."""

    def __init__(self) -> None:
        self._sizes: dict[int, _Size] = {}

    def drafting(self, answers: int) -> bool:
        """Whether the `answers` decoding in this step may draft (alone: always)."""
        if answers < 2:
            return True
        return self._sizes.setdefault(size_class(answers), _Size()).drafting

    def ran(self, answers: int, tokens: int, seconds: float, reading: bool) -> None:
        """A step of `answers` decoding answers committed `tokens` in `seconds`;
        `reading`: it also read a prompt chunk (its time is not a decoding step's)."""
        if answers < 2:
            return
        size = self._sizes.setdefault(size_class(answers), _Size())
        if not reading and seconds > 0:
            size.tokens += tokens
            size.seconds += seconds
        size.left -= 1
        if size.left <= 0:
            self._next_epoch(size)

    def rates(self, answers: int) -> dict[bool, float]:
        """What each way has shown at this size (tokens per second)."""
        size = self._sizes.get(size_class(answers))
        return dict(size.rates) if size is not None else {}

    @staticmethod
    def _next_epoch(size: _Size) -> None:
        if size.seconds > 0:
            rate = size.tokens / size.seconds
            old = size.rates.get(size.drafting)
            size.rates[size.drafting] = rate if old is None else old + WEIGHT * (rate - old)
        size.epochs += 1
        size.tokens, size.seconds, size.left = 0, 0.0, EPOCH
        if len(size.rates) < 2:  # a way not yet seen is tried next
            if size.drafting in size.rates:
                size.drafting = not size.drafting
            return
        better = size.rates[True] >= size.rates[False]
        size.drafting = better if size.epochs % EXPLORE else not better
