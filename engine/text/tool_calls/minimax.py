"""MiniMax-M3: namespaced XML calls, every tag prefixed with the namespace token `]<]minimax[>[`.

    ]<]minimax[>[<tool_call>
    ]<]minimax[>[<invoke name="search">]<]minimax[>[<query>llamas]<]minimax[>[</query>
    ]<]minimax[>[<filters>]<]minimax[>[<item>]<]minimax[>[<year>2024]<]minimax[>[</year>]<]minimax[>[</item>
    ]<]minimax[>[</filters>]<]minimax[>[</invoke>
    ]<]minimax[>[</tool_call>

One block holds all the calls. Each argument is an element named after its parameter; as the template's
`to_xml` writes them, objects nest their members as elements, arrays wrap each element in `<item>`,
strings are raw text and other scalars are their JSON text. Which is which comes from the tool's JSON
schema, as in llama.cpp: a value whose schema admits a string is a string (so anyOf/oneOf with a string
alternative is text); for other unions, and for parameters the schema does not describe, the shape of
the text decides (nested elements, items, or a scalar that is JSON if it parses, else a string).
A turn without thinking starts with a bare `</mm:think>`, which is dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.reasoning import partial_suffix
from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    ContentState,
    Driver,
    DriverFormat,
    Marker,
    Next,
    PatternState,
    SkipSpace,
    State,
    expect,
)
from engine.text.tool_calls.syntax import (
    Json,
    Lit,
    Node,
    Rep,
    Space,
    ToolGrammar,
    Trigger,
    Until,
    alt,
    calls,
    seq,
)

NS = "]<]minimax[>["
THINKING = ReasoningTags("<mm:think>", ("</mm:think>",))
BLOCK_OPEN, BLOCK_CLOSE = NS + "<tool_call>", NS + "</tool_call>"
INVOKE_CLOSE = NS + "</invoke>"
ITEM_OPEN, ITEM_CLOSE = NS + "<item>", NS + "</item>"
_NS = re.escape(NS)
Schema = Mapping[str, Any]


class MiniMaxM3(DriverFormat):
    name = "MiniMax-M3"
    reasoning_tags = THINKING
    markup_without_calls = True  # a bare </mm:think> opening an answer is taken off every answer
    preserved_tokens = (NS, "<tool_call>", "</tool_call>", THINKING.start, THINKING.end)

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        schemas = {tool_name(t): tool_parameters(t) for t in tools}
        content = _content(schemas)
        start = expect(r"\s*" + re.escape(THINKING.end), content, otherwise=content)
        return start

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        invoke = alt(*[_invoke_rule(t) for t in choice.tools])
        root = seq(
            Lit(BLOCK_OPEN), Space(), calls(invoke, parallel_tool_calls, Space()), Space(), Lit(BLOCK_CLOSE)
        )
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=(Trigger("word", BLOCK_OPEN),))


# -- the grammar side ---------------------------------------------------------------------------------


def _invoke_rule(tool: Mapping[str, Any]) -> Node:
    body = _members_rule(tool_parameters(tool))
    return seq(Lit(f'{NS}<invoke name="{tool_name(tool)}">'), Space(), body, Space(), Lit(INVOKE_CLOSE))


def _members_rule(schema: Schema) -> Node:
    """Required members in schema order, then any optional ones in any order."""
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    first = [_element_rule(k, v) for k, v in properties.items() if k in required]
    optional = [_element_rule(k, v) for k, v in properties.items() if k not in required]
    parts: list[Node] = []
    for i, element in enumerate(first):
        parts += [Space(), element] if i else [element]
    if optional:
        parts.append(Rep(seq(Space(), alt(*optional))))
    return seq(*parts) if parts else Lit("")


def _element_rule(key: str, schema: Schema) -> Node:
    close = f"{NS}</{key}>"
    return seq(Lit(f"{NS}<{key}>"), _value_rule(schema, close), Lit(close))


def _value_rule(schema: Schema, close: str) -> Node:
    if may_be_string(schema):
        return Until(close)
    alternatives = _alternatives(schema)
    if alternatives:
        return alt(*[_value_rule(a, close) for a in alternatives])
    if _is_object(schema):
        return seq(_members_rule(schema), Space())
    if schema.get("type") == "array":
        item = seq(
            Space(), Lit(ITEM_OPEN), _value_rule(schema.get("items") or {}, ITEM_CLOSE), Lit(ITEM_CLOSE)
        )
        return seq(Rep(item), Space())
    return Json(dict(schema))


def may_be_string(schema: Schema) -> bool:
    """Whether text in the element may be a string: a string type, an untyped schema, or a union with a
    string alternative (a string accepts anything, so the union is a string)."""
    alternatives = _alternatives(schema)
    if alternatives:
        return any(may_be_string(a) for a in alternatives)
    kind = schema.get("type")
    if isinstance(kind, list):
        return "string" in kind
    if kind is None:
        return not any(k in schema for k in ("properties", "items", "enum", "const"))
    return kind == "string"


def _alternatives(schema: Schema) -> list[Schema]:
    return list(schema.get("anyOf") or schema.get("oneOf") or [])


def _is_object(schema: Schema) -> bool:
    return bool(schema.get("properties")) and schema.get("type", "object") == "object"


# -- the parser side ----------------------------------------------------------------------------------


def _content(schemas: Mapping[str, Schema]) -> Next:
    return lambda: ContentState([Marker(BLOCK_OPEN, lambda: SkipSpace(lambda: _invoke(schemas)))])


def _invoke(schemas: Mapping[str, Schema]) -> State:
    def opened(d: Driver, match: regex.Match[str]) -> State:
        d.emit.open_call(match.group(1))
        d.commit()
        d.emit.arguments("{")
        schema = schemas.get(match.group(1), {})
        return _Members(schema, INVOKE_CLOSE, lambda d: _after_invoke(d, schemas))

    return PatternState(_NS + r'<invoke name="([^"]*)">', opened)


def _after_invoke(d: Driver, schemas: Mapping[str, Schema]) -> State:
    d.emit.arguments("}")
    another = lambda: SkipSpace(lambda: _invoke(schemas))  # noqa: E731
    return expect(r"\s*" + re.escape(BLOCK_CLOSE), lambda: SkipSpace(_content(schemas)), otherwise=another)


Then = Callable[[Driver], State]


class _Members(State):
    """The members of an object, up to `close`; `then` runs after the close tag."""

    def __init__(self, schema: Schema, close: str, then: Then, first: bool = True) -> None:
        self.schema, self.close, self.then, self.first = schema, close, then, first

    def step(self, d: Driver) -> bool:
        pattern = r"\s*(?:" + re.escape(self.close) + r"|" + _NS + r"<([^<>/\s]+)>)"
        d.state = PatternState(pattern, self._member)
        return True

    def _member(self, d: Driver, match: regex.Match[str]) -> State:
        key = match.group(1)
        if key is None:
            return self.then(d)
        d.emit.arguments(("" if self.first else ",") + json.dumps(key, ensure_ascii=False) + ":")
        properties = self.schema.get("properties") or {}
        rest = _Members(self.schema, self.close, self.then, first=False)
        return _value(properties.get(key, {}), f"{NS}</{key}>", lambda d: rest)


def _value(schema: Schema, close: str, then: Then) -> State:
    if may_be_string(schema) and schema:
        return _String(close, then)
    alternatives = _alternatives(schema)
    if _is_object(schema):
        return _Object(schema, close, then)
    if schema.get("type") == "array":
        return _Array(schema.get("items") or {}, close, then)
    if alternatives or not schema:
        return _Shape(schema, close, then)
    return _Scalar(close, then)


class _Object(State):
    def __init__(self, schema: Schema, close: str, then: Then) -> None:
        self.schema, self.close, self.then = schema, close, then

    def step(self, d: Driver) -> bool:
        d.emit.arguments("{")
        d.state = _Members(self.schema, self.close, self._closed)
        return True

    def _closed(self, d: Driver) -> State:
        d.emit.arguments("}")
        return self.then(d)


class _Array(State):
    """`<item>` elements up to `close`."""

    def __init__(self, items: Schema, close: str, then: Then, first: bool = True) -> None:
        self.items, self.close, self.then, self.first = items, close, then, first

    def step(self, d: Driver) -> bool:
        if self.first:
            d.emit.arguments("[")
        pattern = r"\s*(?:(" + re.escape(ITEM_OPEN) + r")|" + re.escape(self.close) + r")"
        d.state = PatternState(pattern, self._item)
        return True

    def _item(self, d: Driver, match: regex.Match[str]) -> State:
        if match.group(1) is None:
            d.emit.arguments("]")
            return self.then(d)
        if not self.first:
            d.emit.arguments(",")
        rest = _Array(self.items, self.close, self.then, first=False)
        return _value(self.items, ITEM_CLOSE, lambda d: rest)


class _String(State):
    """Raw text up to `close`, streamed as a JSON string (a suffix that may start `close` waits)."""

    def __init__(self, close: str, then: Then) -> None:
        self.close, self.then = close, then
        self._opened = False

    def step(self, d: Driver) -> bool:
        if not self._opened:
            d.emit.arguments('"')
            self._opened = True
            return True
        at = d.buf.find(self.close)
        if at >= 0:
            d.emit.arguments(_escaped(d.consume(at)) + '"')
            d.consume(len(self.close))
            d.state = self.then(d)
            return True
        keep = partial_suffix(d.buf, (self.close,))
        if keep == len(d.buf):
            return False
        d.emit.arguments(_escaped(d.consume(len(d.buf) - keep)))
        return True


class _Scalar(State):
    """Text up to `close`, given as JSON when it is JSON (numbers, booleans, null), else as a string."""

    def __init__(self, close: str, then: Then) -> None:
        self.close, self.then = close, then

    def step(self, d: Driver) -> bool:
        at = d.buf.find(self.close)
        if at < 0:
            return False
        text = d.consume(at)
        d.consume(len(self.close))
        d.emit.arguments(_json_or_string(text))
        d.state = self.then(d)
        return True


class _Shape(State):
    """A value whose schema does not say its shape: nested elements, items, or a scalar."""

    def __init__(self, schema: Schema, close: str, then: Then) -> None:
        self.schema, self.close, self.then = schema, close, then

    def step(self, d: Driver) -> bool:
        text = d.buf.lstrip()
        for opening, state in ((ITEM_OPEN, self._array), (NS + "<", self._object)):
            if text.startswith(opening) and not text.startswith(self.close):
                d.state = state()
                return True
            if opening.startswith(text) and not d.final:
                return False
        d.state = _Scalar(self.close, self.then)
        return True

    def _array(self) -> State:
        items = next((a.get("items") for a in _alternatives(self.schema) if a.get("type") == "array"), None)
        return _Array(items or {}, self.close, self.then)

    def _object(self) -> State:
        objects = [a for a in _alternatives(self.schema) if _is_object(a)]
        return _Object(objects[0] if objects else {}, self.close, self.then)


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _json_or_string(text: str) -> str:
    try:
        return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":"))
    except json.JSONDecodeError:
        return json.dumps(text, ensure_ascii=False)
