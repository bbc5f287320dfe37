"""Llama 3.1, 3.2 and 3.3: a JSON call at the start of the answer, and `<|python_tag|>` built-in calls.

    {"name": "get_weather", "parameters": {"city": "Paris"}}            (optionally "type": "function" first)
    <|python_tag|>brave_search.call(query="llamas")                      (templates that have <|python_tag|>)

As in llama.cpp, the JSON call counts only at the start of the answer (after blanks) and there is one;
text after it is content. Built-in tools are the tools named wolfram_alpha, web_search, brave_search
(one `query` parameter), python or code_interpreter (one `code` parameter); their calls are written in
Python's keyword syntax and their arguments become a JSON object. The template gets `date_string`,
`tools_in_user_message` and `builtin_tools` as llama.cpp sets them; `<|eom_id|>` is an extra stop.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import regex

from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    ArgumentsSink,
    CallKeys,
    CallObjectSink,
    ContentState,
    Driver,
    DriverFormat,
    JsonState,
    Marker,
    Next,
    PatternState,
    RestIsContent,
    SkipSpace,
    State,
)
from engine.text.tool_calls.syntax import Json, Lit, Node, ToolGrammar, Trigger, alt, seq

PYTHON_TAG = "<|python_tag|>"
BUILTIN_PARAMETERS = {
    "wolfram_alpha": "query",
    "web_search": "query",
    "brave_search": "query",
    "python": "code",
    "code_interpreter": "code",
}
_KEYS = CallKeys(arguments=("parameters", "arguments"), before_name=("type",))
# llama.cpp's trigger: anything at the start that looks like the JSON of a call (names are not checked:
# small models invent them, and the grammar then holds them to the real ones).
_JSON_CALL_TRIGGER = r"(\{\s*(?:\"type\"\s*:\s*\"function\"\s*,\s*)?\"name\"\s*:\s*\")[\s\S]*"


class Llama3(DriverFormat):
    extra_stops = ("<|eom_id|>",)

    def __init__(self, builtin_tools: bool) -> None:
        self.builtin_tools = builtin_tools  # the template knows <|python_tag|>
        self.name = "Llama 3.x with builtin tools" if builtin_tools else "Llama 3.x"
        self.preserved_tokens = (PYTHON_TAG,) if builtin_tools else ()

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _Start(self._content)

    def _content(self) -> State:
        return ContentState([Marker(PYTHON_TAG, _python_tag_call)] if self.builtin_tools else [])

    def builtin_names(self, tools: Sequence[Mapping[str, Any]]) -> list[str]:
        return [tool_name(t) for t in tools if self.builtin_tools and _builtin_parameter(t) is not None]

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        options: list[Node] = [Json(_json_call_schema(t)) for t in choice.tools]
        triggers = [Trigger("pattern_full", _JSON_CALL_TRIGGER)]
        builtin = [t for t in choice.tools if self.builtin_tools and _builtin_parameter(t) is not None]
        options += [_builtin_call(t) for t in builtin]
        if builtin:
            triggers.append(Trigger("word", PYTHON_TAG))
        return ToolGrammar(alt(*options), lazy=choice.mode == "auto", triggers=tuple(triggers))

    def template_context(self, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        context: dict[str, Any] = {
            "date_string": datetime.now().strftime("%d %b %Y"),
            "tools_in_user_message": False,
        }
        builtin = self.builtin_names(tools)
        if builtin:
            context["builtin_tools"] = builtin
        return context


def _builtin_parameter(tool: Mapping[str, Any]) -> str | None:
    """The single parameter of a built-in tool, or None when the tool is not one (by name and shape)."""
    parameter = BUILTIN_PARAMETERS.get(tool_name(tool))
    schema = tool_parameters(tool)
    properties = schema.get("properties") or {}
    if parameter is None or list(properties) != [parameter] or parameter not in schema.get("required", []):
        return None
    return parameter


def _json_call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    """One JSON call; llama.cpp lets it open with `"type": "function",` (the grammar keeps this order)."""
    properties = {
        "type": {"type": "string", "const": "function"},
        "name": {"type": "string", "const": tool_name(tool)},
        "parameters": tool_parameters(tool),
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


def _builtin_call(tool: Mapping[str, Any]) -> Node:
    parameter = _builtin_parameter(tool)
    assert parameter is not None
    schema = tool_parameters(tool)["properties"][parameter]
    return seq(Lit(f"{PYTHON_TAG}{tool_name(tool)}.call({parameter}="), Json(schema), Lit(")"))


class _Start(State):
    """The answer's first non-blank character decides: `{` may be a call, anything else is content."""

    def __init__(self, content: Next) -> None:
        self.content = content

    def step(self, d: Driver) -> bool:
        stripped = d.buf.lstrip()
        if not stripped and not d.final:
            return False
        if stripped.startswith("{"):
            d.begin_tentative()
            d.state = _json_call(self.content)
        else:
            d.state = self.content()
        return True


def _json_call(then: Next) -> State:
    return JsonState(CallObjectSink(_KEYS), lambda: SkipSpace(then))


def _python_tag_call() -> State:
    """After <|python_tag|>: `name.call(key=value, ...)`, or a JSON call object."""

    def header(d: Driver, match: regex.Match[str]) -> State:
        if match.group(1) is None:
            return _json_call(RestIsContent)
        d.emit.open_call(match.group(1))
        return _BuiltinArguments(first=True)

    return PatternState(r"\s*(?:(\w+)\s*\.\s*call\(|(?=\{))", header)


class _BuiltinArguments(State):
    """`key=<JSON value>` pairs up to `)`, streamed as the members of a JSON object."""

    def __init__(self, first: bool) -> None:
        self.first = first

    def step(self, d: Driver) -> bool:
        d.state = PatternState(r"\s*(?:(\w+)\s*=\s*|\))", self._argument)
        return True

    def _argument(self, d: Driver, match: regex.Match[str]) -> State:
        d.commit()
        key = match.group(1)
        if key is None:
            d.emit.arguments("{}" if self.first else "}")
            return SkipSpace(RestIsContent)
        d.emit.arguments(("{" if self.first else ",") + json.dumps(key) + ":")
        return JsonState(ArgumentsSink(), lambda: PatternState(r"\s*([,)])", self._separator))

    def _separator(self, d: Driver, match: regex.Match[str]) -> State:
        if match.group(1) == ",":
            return _BuiltinArguments(first=False)
        d.emit.arguments("}")
        return SkipSpace(RestIsContent)
