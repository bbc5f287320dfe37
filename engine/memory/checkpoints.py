"""Checkpoints of recurrent state (`--ctx-checkpoints`): snapshots at chosen positions of a sequence.

A recurrent state cannot be cut back to a shorter prefix, yet an agent's next turn usually shares all
of the previous prompt and diverges inside or after the reply (a template that re-renders the reply
without its reasoning, a tool result appended). The scheduler ends prompt chunks where a snapshot is
worth having (engine/memory/hybrid.py `checkpoint_positions`); a truncation then restores the nearest
snapshot at or below the kept prefix, and only the rest is processed again.

Bounded as llama-server bounds them: at most `max_count` per sequence (the oldest goes first); a
prompt cache entry that carries them counts their bytes against `--cache-ram`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.memory.base import MemoryState

DEFAULT_MAX_COUNT = 32  # llama-server's --ctx-checkpoints default


@dataclass
class Checkpoints:
    """One sequence's snapshots (recurrent part only), by the number of tokens they have absorbed."""

    max_count: int = DEFAULT_MAX_COUNT
    states: list[MemoryState] = field(default_factory=list)  # ascending n_tokens

    @property
    def n_bytes(self) -> int:
        return sum(s.n_bytes for s in self.states)

    def add(self, state: MemoryState) -> None:
        if self.max_count <= 0:
            return
        self.states = [s for s in self.states if s.n_tokens != state.n_tokens]
        self.states.append(state)
        self.states.sort(key=lambda s: s.n_tokens)
        while len(self.states) > self.max_count:  # the oldest prefix goes first, as llama-server's
            self.states.pop(0)

    def at_or_below(self, n: int) -> MemoryState | None:
        """The latest snapshot that has absorbed at most n tokens."""
        best = [s for s in self.states if s.n_tokens <= n]
        return best[-1] if best else None

    def drop_after(self, n: int) -> None:
        """Forget the snapshots past n tokens (their tokens are no longer the sequence's)."""
        self.states = [s for s in self.states if s.n_tokens <= n]

    def clear(self) -> None:
        self.states = []

    def copy(self) -> Checkpoints:
        return Checkpoints(self.max_count, list(self.states))
