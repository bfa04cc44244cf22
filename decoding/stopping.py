"""Stop sequences over the generated text, and how much of it is safe to stream."""

from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops

    def find(self, text: str, start: int = 0) -> int | None:
        """Index where the earliest stop sequence begins, or None; text before `start` was checked already
        (and streamed, so `start` never falls inside a partial match: safe_length held it back)."""
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else None

    def safe_length(self, text: str) -> int:
        """Length of the prefix that cannot turn into a stop sequence: hold back a partial match."""
        hold = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(text)), hold, -1):
                if text.endswith(stop[:n]):
                    hold = n
                    break
        return len(text) - hold
