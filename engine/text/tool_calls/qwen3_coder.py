"""Qwen3-Coder's XML calls, also Qwen3.5's (with `<think>` reasoning), Nemotron 3 Nano's and StepFun 3.5's:

    <tool_call>
    <function=edit>
    <parameter=filename>
    foo.c
    </parameter>
    <parameter=count>
    3
    </parameter>
    </function>
    </tool_call>

Each parameter's value is the text between its opening line and `\\n</parameter>\\n`. As in llama.cpp
(common/parsers/qwen3-coder.cpp), the tool's JSON schema types it: a parameter that can only be a
string is the raw text; one that cannot be a string is JSON; for one that may be either, JSON of an
allowed kind (object, array, number, boolean, null) wins and other text is a string. Calls follow the
content (and the reasoning); what follows the last call is dropped, as llama.cpp's parser leaves it.
A template with `<think>` gets the thinking variant: its reasoning ends at `</think>` or where a call
opens; Qwen3-Coder's (none) may open a call with `<function=NAME>` alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.reasoning import partial_suffix
from engine.text.tool_calls.common import Prefill, ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.schema_types import ALL_TYPES, value_types
from engine.text.tool_calls.stream import (
    ContentState,
    Driver,
    DriverFormat,
    Marker,
    Next,
    ParseFailure,
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
    opt,
    seq,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PARAM_CLOSE = "\n</parameter>\n"
GEN_PREFIX = "<|im_start|>assistant\n"
# llama.cpp forces the first end tag ("\n</think>") and takes a call's opening as the block's end too.
THINKING = ReasoningTags("<think>", ("\n</think>", "</think>"), stops=(OPEN,))
Schemas = Mapping[str, Mapping[str, Any]]


class Qwen3Coder(DriverFormat):
    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.name = "Qwen3-Coder (thinking)" if thinking else "Qwen3-Coder"
        self.reasoning_tags = THINKING if thinking else None
        self.preserved_tokens = (OPEN, CLOSE, "<think>", "</think>") if thinking else (OPEN, CLOSE)

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        schemas = {tool_name(t): tool_parameters(t) for t in tools}
        return _content(schemas, self._starts(schemas))

    def _starts(self, names: Sequence[str] | Schemas) -> tuple[str, ...]:
        """What opens a call: `<tool_call>`, and for Qwen3-Coder (which sometimes leaves it out) each
        tool's `<function=NAME>` opening."""
        return (OPEN,) if self.thinking else (OPEN, *(f"<function={name}>" for name in names))

    def continue_prompt(
        self, prompt: str, generation_prompt: str, prefill: Prefill, tags: ReasoningTags | None
    ) -> tuple[str, str]:
        """llama.cpp's own continuation: the assistant header, then `<think>\\n`, the reasoning and for
        content `\\n</think>\\n\\n` and the content (whatever the template's generation prompt was)."""
        base = prompt[: len(prompt) - len(generation_prompt)] + GEN_PREFIX
        text = ""
        if self.thinking:
            text = "<think>\n" + prefill.reasoning
            if prefill.mode == "content":
                text += "\n</think>\n\n"
        return base, text + (prefill.content if prefill.mode == "content" else "")

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        body = seq(alt(*[_function_rule(t) for t in choice.tools]), Lit(CLOSE), Space())
        call = seq(Lit(OPEN + "\n"), body)
        first = call if self.thinking else seq(opt(Lit(OPEN + "\n")), body)
        root = seq(first, Rep(call)) if parallel_tool_calls else first
        triggers = tuple(Trigger("word", s) for s in self._starts([tool_name(t) for t in choice.tools]))
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=triggers)


# -- the grammar side ---------------------------------------------------------------------------------


def _function_rule(tool: Mapping[str, Any]) -> Node:
    """`<function=NAME>` and the parameters: the required ones first, in the schema's order (llama.cpp
    lets them come in any order), then any optional ones."""
    schema = tool_parameters(tool)
    properties = schema.get("properties") or {}
    required = set(schema.get("required") or ())
    first = [_parameter_rule(k, v, schema) for k, v in properties.items() if k in required]
    optional = [_parameter_rule(k, v, schema) for k, v in properties.items() if k not in required]
    rest = [Rep(alt(*optional))] if optional else []
    return seq(Lit(f"<function={tool_name(tool)}>\n"), *first, *rest, Lit("</function>\n"))


def _parameter_rule(key: str, schema: Mapping[str, Any], root: Mapping[str, Any]) -> Node:
    types = value_types(schema, root)
    if "string" in types:  # the raw text (a JSON alternative is text too)
        value: Node = Until(PARAM_CLOSE)
    else:  # with the definitions its references may name
        defs = {k: root[k] for k in ("$defs", "definitions") if k in root and k not in schema}
        value = Json({**schema, **defs})
    return seq(Lit(f"<parameter={key}>\n"), value, Lit(PARAM_CLOSE))


# -- the parser side ----------------------------------------------------------------------------------


def _content(schemas: Schemas, starts: tuple[str, ...]) -> State:
    markers = [Marker(OPEN, lambda: _function(schemas, starts))]
    for start in starts[1:]:  # `<function=NAME>` alone: the name is the marker's
        markers.append(Marker(start, lambda name=start[10:-1]: _opened(schemas, starts, name)))
    return ContentState(markers)


def _function(schemas: Schemas, starts: tuple[str, ...]) -> State:
    def opened(d: Driver, match: regex.Match[str]) -> State:
        return _open(d, schemas, starts, match.group(1))

    return PatternState(r"\s*<function=([^>\n]*)>", opened)


def _opened(schemas: Schemas, starts: tuple[str, ...], name: str) -> State:
    class Opened(State):
        def step(self, d: Driver) -> bool:
            d.state = _open(d, schemas, starts, name)
            return True

    return Opened()


def _open(d: Driver, schemas: Schemas, starts: tuple[str, ...], name: str) -> State:
    if schemas and name not in schemas:
        raise ParseFailure(f"no tool is named {name!r}")
    d.emit.open_call(name)
    d.commit()
    d.emit.arguments("{")
    schema = schemas.get(name, {})
    return expect(r"\n?", lambda: _Parameters(schema, lambda: _after_call(schemas, starts)))


def _after_call(schemas: Schemas, starts: tuple[str, ...]) -> State:
    """More calls, each in its tags; anything else after the calls is dropped (llama.cpp's parser stops)."""
    another = lambda: expect(re.escape(OPEN), lambda: _function(schemas, starts), otherwise=_Dropped)  # noqa: E731
    return SkipSpace(another)


class _Dropped(State):
    def step(self, d: Driver) -> bool:
        if not d.buf:
            return False
        d.consume(len(d.buf))
        return True


class _Parameters(State):
    """`<parameter=KEY>` elements up to `</function>`, then `</tool_call>`."""

    def __init__(self, schema: Mapping[str, Any], then: Next, first: bool = True) -> None:
        self.schema, self.then, self.first = schema, then, first

    def step(self, d: Driver) -> bool:
        d.state = PatternState(r"\s*(?:(</function>)|<parameter=([^>\n]*)>)", self._element)
        return True

    def _element(self, d: Driver, match: regex.Match[str]) -> State:
        if match.group(1) is not None:
            d.emit.arguments("}")
            return expect(r"\s*" + re.escape(CLOSE), self.then)
        key = match.group(2)
        d.emit.arguments(("" if self.first else ",") + json.dumps(key, ensure_ascii=False) + ":")
        rest = _Parameters(self.schema, self.then, first=False)
        properties = self.schema.get("properties") or {}
        types = value_types(properties[key], self.schema) if key in properties else ALL_TYPES
        value = _String(rest) if types == {"string"} else _Typed(types, rest)
        return _LineBreak(value)


class _LineBreak(State):
    """The line break that ends a parameter's opening tag (the value starts after it)."""

    def __init__(self, then: State) -> None:
        self.then = then

    def step(self, d: Driver) -> bool:
        if not d.buf and not d.final:
            return False
        if d.buf.startswith("\n"):
            d.consume(1)
        d.state = self.then
        return True


class _String(State):
    """Raw text up to the parameter's close, streamed as a JSON string."""

    def __init__(self, then: State) -> None:
        self.then = then
        self._opened = False

    def step(self, d: Driver) -> bool:
        if not self._opened:
            d.emit.arguments('"')
            self._opened = True
            return True
        at = d.buf.find(PARAM_CLOSE)
        if at >= 0:
            d.emit.arguments(_escaped(d.consume(at)) + '"')
            d.consume(len(PARAM_CLOSE))
            d.state = self.then
            return True
        keep = partial_suffix(d.buf, (PARAM_CLOSE,))
        if keep == len(d.buf):
            return False
        d.emit.arguments(_escaped(d.consume(len(d.buf) - keep)))
        return True


class _Typed(State):
    """A value the schema types otherwise: JSON of an allowed kind; else, where a string is allowed,
    the text as a string (given whole, once its close is here)."""

    def __init__(self, types: frozenset[str], then: State) -> None:
        self.types, self.then = types, then

    def step(self, d: Driver) -> bool:
        at = d.buf.find(PARAM_CLOSE)
        if at < 0:
            return False
        text = d.consume(at)
        d.consume(len(PARAM_CLOSE))
        d.emit.arguments(_typed(text, self.types))
        d.state = self.then
        return True


_KINDS = ((bool, "boolean"), (dict, "object"), (list, "array"), (int, "number"), (float, "number"))
_NOT_JSON = object()


def _typed(text: str, types: frozenset[str]) -> str:
    """A value of a parameter that is not only a string: any JSON where a string is not allowed, else
    JSON of an allowed kind other than a string (llama.cpp tries those first), else the text."""
    value = _json(text)
    if "string" not in types:
        if value is _NOT_JSON:
            raise ParseFailure(f"{text!r} is not the parameter's JSON value")
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    kind = "null" if value is None else next((k for t, k in _KINDS if isinstance(value, t)), "")
    if value is not _NOT_JSON and kind and (kind in types or (kind == "number" and "integer" in types)):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    return json.dumps(text, ensure_ascii=False)


def _json(text: str) -> Any:
    try:
        return json.loads(text, parse_constant=_no_constant)
    except (json.JSONDecodeError, ValueError):
        return _NOT_JSON


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def detect(template_source: str) -> Qwen3Coder | None:
    """llama.cpp's sign of a Qwen3-Coder-style template (not one that writes `<tool_call><function=` on one
    line), and whether it thinks."""
    signs = (OPEN, "<function=", "<parameter=")
    if not all(sign in template_source for sign in signs) or _ONE_LINE in template_source:
        return None
    return Qwen3Coder(thinking="<think>" in template_source)


_ONE_LINE = "'<tool_call><function=' ~ tool_call.name ~ '>'"
