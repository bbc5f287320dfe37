"""A small backtracking matcher for the tool-call grammar descriptions (engine/text/tool_calls/syntax.py),
so tests can check that a format's grammar accepts the outputs its parser reads. JSON values are decoded
with the json module and checked against the subset of JSON Schema the formats use."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import regex

from engine.text.tool_calls.syntax import Alt, Json, Lit, Node, Regex, Rep, Seq, Space, ToolGrammar, Until

_DECODER = json.JSONDecoder()


def matches(node: Node, text: str) -> bool:
    return any(end == len(text) for end in _match(node, text, 0))


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


def _match(node: Node, text: str, i: int) -> Iterator[int]:
    if isinstance(node, Lit):
        if text.startswith(node.text, i):
            yield i + len(node.text)
    elif isinstance(node, Space):
        end = i
        while end < len(text) and text[end] in " \t\n\r":
            end += 1
        yield from range(end, i - 1, -1)
    elif isinstance(node, Until):
        stop = text.find(node.stop, i)
        yield from range(stop if stop >= 0 else len(text), i - 1, -1)
    elif isinstance(node, Regex):
        yield from (j for j in range(len(text), i - 1, -1) if regex.fullmatch(node.pattern, text[i:j]))
    elif isinstance(node, Json):
        yield from _json(node.schema, text, i)
    elif isinstance(node, Seq):
        yield from _sequence(node.items, text, i)
    elif isinstance(node, Alt):
        for option in node.options:
            yield from _match(option, text, i)
    elif isinstance(node, Rep):
        yield from _repeat(node, text, i, 0)


def _sequence(items: tuple[Node, ...], text: str, i: int) -> Iterator[int]:
    if not items:
        yield i
        return
    for middle in _match(items[0], text, i):
        yield from _sequence(items[1:], text, middle)


def _repeat(node: Rep, text: str, i: int, count: int) -> Iterator[int]:
    if node.max is None or count < node.max:
        for middle in _match(node.item, text, i):
            if middle > i:
                yield from _repeat(node, text, middle, count + 1)
    if count >= node.min:
        yield i


def _json(schema: dict[str, Any], text: str, i: int) -> Iterator[int]:
    try:
        value, end = _DECODER.raw_decode(text, i)
    except json.JSONDecodeError:
        return
    if valid(value, schema):
        yield end


def valid(value: Any, schema: dict[str, Any]) -> bool:
    """The JSON Schema keywords the formats' grammars use."""
    for key in ("anyOf", "oneOf"):
        if key in schema and not any(valid(value, s) for s in schema[key]):
            return False
    if "const" in schema and value != schema["const"]:
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "type" in schema and not _typed(value, schema["type"]):
        return False
    if isinstance(value, str):
        if "pattern" in schema and not regex.search(schema["pattern"], value):
            return False
        return len(value) >= schema.get("minLength", 0)
    if isinstance(value, list):
        count_ok = schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value))
        return count_ok and all(valid(v, schema.get("items", {})) for v in value)
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if any(k not in value for k in schema.get("required", [])):
            return False
        return all(valid(v, properties.get(k, {})) for k, v in value.items())
    return True


def _typed(value: Any, kind: str | list[str]) -> bool:
    if isinstance(kind, list):
        return any(_typed(value, k) for k in kind)
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "null": lambda v: v is None,
    }
    return checks[kind](value)
