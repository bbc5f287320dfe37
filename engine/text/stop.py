"""Stop strings on a text stream: emit text as soon as it cannot be the start of a stop string."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StopMatcher:
    stops: list[str]
    _held: str = field(default="", init=False)

    def push(self, text: str) -> tuple[str, str | None]:
        """Feed new text; returns (text safe to emit, the stop string if one was completed).

        On a match, the emitted text ends just before the stop string and the rest is dropped.
        """
        buf = self._held + text
        first = min(((buf.find(s), s) for s in self.stops if s and s in buf), default=None)
        if first is not None:
            self._held = ""
            return buf[: first[0]], first[1]
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep :] if keep else ""
        return buf[: len(buf) - keep], None

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best
