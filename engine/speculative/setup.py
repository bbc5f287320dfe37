"""The engine's speculators: every n-gram one (a request turns them on), the draft model when loaded."""

from __future__ import annotations

from engine.speculative.base import Speculation, Speculator
from engine.speculative.draft import DraftModel
from engine.speculative.ngram import NgramCache, NgramMapK, NgramSimple


def speculation(draft: DraftModel | None = None, *extra: Speculator) -> Speculation:
    """A chain of every speculator this engine has; `extra` ones (block drafters) join it by name."""
    speculators: list[Speculator] = [NgramSimple(), NgramMapK(), NgramCache(), *extra]
    if draft is not None:
        speculators.append(draft)
    return Speculation({s.name: s for s in speculators})
