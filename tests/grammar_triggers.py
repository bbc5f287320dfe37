"""Where a lazy tool-call grammar starts on a text, by llama.cpp's trigger rules, for the tests that
check a format's grammar (through the real grammar engine) from its trigger on."""

from __future__ import annotations

import regex

from engine.text.tool_calls.syntax import ToolGrammar


def grammar_start(grammar: ToolGrammar, text: str) -> int | None:
    """Where llama.cpp would start feeding the grammar: the earliest trigger that fires on `text`."""
    starts = [s for s in (_trigger_start(t.kind, t.value, text) for t in grammar.triggers) if s is not None]
    return min(starts, default=None)


def _trigger_start(kind: str, value: str, text: str) -> int | None:
    if kind == "word":
        at = text.find(value)
        return at if at >= 0 else None
    if kind == "pattern":
        found = regex.search(value, text)
        return found.start() if found else None
    full = regex.fullmatch(value, text)
    if full is None:
        return None
    groups = [full.start(i) for i in range(1, (full.re.groups or 0) + 1) if full.group(i)]
    return groups[0] if groups else 0
