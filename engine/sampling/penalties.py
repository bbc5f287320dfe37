"""The repetition penalties (llama.cpp's `penalties`): repeat, frequency and presence over the last n
tokens (prompt included), counted incrementally."""

from __future__ import annotations

from collections import Counter, deque

import numpy as np

from engine.sampling.params import SamplingParams


class PenaltyWindow:
    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        window = params.repeat_last_n
        self._window: int | None = window if window >= 0 else None
        self._history: deque[int] = deque()
        self._counts: Counter[int] = Counter()

    def accept(self, token: int) -> None:
        """Record a prompt or generated token (the oldest leaves a full window)."""
        if self._window == 0:
            return
        self._history.append(token)
        self._counts[token] += 1
        if self._window is not None and len(self._history) > self._window:
            old = self._history.popleft()
            self._counts[old] -= 1
            if self._counts[old] == 0:
                del self._counts[old]

    @property
    def active(self) -> bool:
        return self.params.has_penalties and bool(self._counts)

    def amounts(self) -> tuple[np.ndarray, np.ndarray]:
        """(tokens in the window, what each loses after the repeat penalty: count * frequency + presence)."""
        p = self.params
        tokens = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
        counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(self._counts))
        return tokens, counts * np.float32(p.frequency_penalty) + np.float32(p.presence_penalty)

    def apply(self, work: np.ndarray) -> None:
        """Penalise a whole logit vector in place (the default chain's path)."""
        tokens, amounts = self.amounts()
        inside = (tokens >= 0) & (tokens < work.size)
        tokens, amounts = tokens[inside], amounts[inside]
        values = work[tokens]
        # Dividing a negative logit would raise its probability, hence multiply those (as llama.cpp).
        repeat = np.float32(self.params.repeat_penalty)
        values = np.where(values <= 0, values * repeat, values / repeat)
        work[tokens] = values - amounts
