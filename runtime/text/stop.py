"""Stop strings over text that arrives in pieces.

A stop string can be split across tokens ("<|" + "end|>"), and matched stop text must never reach
the client, so the matcher holds back any tail that could still grow into a stop string and
releases it once it cannot.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["StopMatcher"]


class StopMatcher:
    """Truncates a text stream before the first stop string to complete.

    "First" is by where the stop string ends: a stream must stop as soon as one is complete, it
    cannot wait to see whether a longer one that started earlier would also complete.

    `push(text)` returns `(emit, matched)`: the text that is now safe to emit and whether a stop
    string has been seen (then `emit` ends right before it and every later push emits nothing).
    `flush()` releases the held-back tail at the end of the stream. Empty stop strings are ignored.
    """

    def __init__(self, stop_strings: Iterable[str]) -> None:
        self.stop_strings: tuple[str, ...] = tuple(dict.fromkeys(s for s in stop_strings if s))
        self._longest = max((len(s) for s in self.stop_strings), default=0)
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the stream

    @property
    def held(self) -> str:
        """Text withheld so far because it may be the start of a stop string."""
        return self._held

    def push(self, text: str) -> tuple[str, bool]:
        """Add `text`; return the newly emittable text and whether a stop string matched."""
        if self.matched is not None:
            return "", True
        if not self.stop_strings:
            return text, False
        buffer = self._held + text
        hit = self._first_match(buffer)
        if hit is not None:
            start, stop = hit
            self.matched = stop
            self._held = ""
            return buffer[:start], True
        keep = self._partial_tail(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep], False

    def flush(self) -> str:
        """The held-back tail (no stop string can complete any more)."""
        held, self._held = self._held, ""
        return "" if self.matched is not None else held

    def _first_match(self, buffer: str) -> tuple[int, str] | None:
        # The stop string completed first wins (generation halts right there); when several end
        # at the same place the longest, i.e. the earliest starting, is reported.
        best: tuple[int, str] | None = None
        for stop in self.stop_strings:
            at = buffer.find(stop)
            if at < 0:
                continue
            end = at + len(stop)
            if (
                best is None
                or end < best[0] + len(best[1])
                or (end == best[0] + len(best[1]) and at < best[0])
            ):
                best = (at, stop)
        return best

    def _partial_tail(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        for size in range(min(len(buffer), self._longest - 1), 0, -1):
            tail = buffer[len(buffer) - size :]
            if any(stop.startswith(tail) for stop in self.stop_strings):
                return size
        return 0
