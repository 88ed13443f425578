"""Stop strings, exactly: the text handed on never contains one, nor, while the answer
streams, a tail that could still become one.

Text arrives a step at a time with how many of its leading characters came from accepted
draft tokens. `StopCut.push` returns what may be sent now as pieces that each start with
their drafted characters (a piece per run of drafted-then-own text), so a view colouring
drafted text stays exact when held text is released together with newer text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Piece:
    """Text to send; its first `drafted` characters came from accepted draft tokens."""

    text: str
    drafted: int = 0


class StopCut:
    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = tuple(s for s in stops if s)
        self.stopped = False  # a stop string was found: nothing more is sent
        self._held = ""  # a tail that may be the start of a stop string
        self._drafted: list[bool] = []  # per held character: from an accepted draft token

    def push(self, text: str, drafted: int = 0) -> list[Piece]:
        """What of `text` (its first `drafted` characters drafted) can be sent now."""
        if self.stopped:
            return []
        buf = self._held + text
        flags = self._drafted + [True] * drafted + [False] * (len(text) - drafted)
        found = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if found:
            end = min(found)
            self.stopped = True
            self._held, self._drafted = "", []
            return _pieces(buf[:end], flags[:end])
        end = len(buf) - self._could_start(buf)
        self._held, self._drafted = buf[end:], flags[end:]
        return _pieces(buf[:end], flags[:end])

    def flush(self) -> list[Piece]:
        """The held tail, once the answer has ended without completing a stop string."""
        pieces = [] if self.stopped else _pieces(self._held, self._drafted)
        self._held, self._drafted = "", []
        return pieces

    def _could_start(self, buf: str) -> int:
        """The length of the longest tail of `buf` that is a proper prefix of a stop."""
        longest = 0
        for stop in self.stops:
            for k in range(min(len(stop) - 1, len(buf)), longest, -1):
                if buf.endswith(stop[:k]):
                    longest = k
                    break
        return longest


def _pieces(text: str, drafted: list[bool]) -> list[Piece]:
    """`text` split where own text is followed by drafted text again."""
    pieces: list[Piece] = []
    start = 0
    for i in range(1, len(text) + 1):
        if i == len(text) or (drafted[i] and not drafted[i - 1]):
            part = drafted[start:i]
            pieces.append(Piece(text[start:i], part.index(False) if False in part else len(part)))
            start = i
    return pieces
