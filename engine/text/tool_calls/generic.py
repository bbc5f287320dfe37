"""llama.cpp's generic format, for templates with no tool syntax (SmolLM2, Gemma 3, plain chatml).

The whole answer is one JSON object, always under a grammar (never lazy):

    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    {"tool_calls": [{"name": ..., "arguments": ..., "id": ...}, ...]}       (parallel_tool_calls)
    {"response": "the answer to the user"}                                   (not with tool_choice required)

The model learns this from the prompt: llama.cpp adds the system text below, and the template's
polyfills (engine/text/template_caps.py) add the tool list with an example call, and show earlier calls
and tool results as JSON. A `response` string streams as content; an answer that is not such an object
is all content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.text.template_caps import add_system
from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.json_stream import Kind, Piece
from engine.text.tool_calls.stream import (
    CallArraySink,
    CallKeys,
    CallObjectSink,
    Driver,
    DriverFormat,
    JsonState,
    ParseFailure,
    RestIsContent,
    Sink,
    SkipSpace,
    State,
)
from engine.text.tool_calls.syntax import CLOSED, Json, ToolGrammar, any_of

SYSTEM_PROMPT = (
    "Respond in JSON format, either with `tool_call` (a request to call tools) or with `response` reply "
    "to the user's request"
)
_KEYS = CallKeys(id=("id",))


class Generic(DriverFormat):
    name = "Generic"

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _Start()

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        return ToolGrammar(Json(answer_schema(choice, parallel_tool_calls)), lazy=False)

    def answer_grammar(self) -> ToolGrammar | None:
        # The response alone: nothing after it (a model that saw tool results would otherwise go on
        # writing a `tool_response` member of its own).
        return ToolGrammar(Json({**RESPONSE_SCHEMA, "additionalProperties": False}), lazy=False)

    def prepare_messages(self, messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
        return add_system(messages, SYSTEM_PROMPT)


RESPONSE_SCHEMA = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}


def answer_schema(choice: ToolChoice, parallel: bool) -> dict[str, Any]:
    """llama.cpp's schema for the answer object."""
    calls = [_call_schema(t, parallel) for t in choice.tools]
    if parallel:
        items = {"type": "array", "items": any_of(calls), "minItems": 1}
        tool_call = {
            "type": "object",
            "properties": {"tool_calls": items},
            "required": ["tool_calls"],
            **CLOSED,
        }
    else:
        tool_call = {
            "type": "object",
            "properties": {"tool_call": any_of(calls)},
            "required": ["tool_call"],
            **CLOSED,
        }
    if choice.mode == "required":
        return tool_call
    return {"anyOf": [tool_call, RESPONSE_SCHEMA]}


def _call_schema(tool: Mapping[str, Any], parallel: bool) -> dict[str, Any]:
    properties: dict[str, Any] = {
        "name": {"type": "string", "const": tool_name(tool)},
        "arguments": tool_parameters(tool),
    }
    required = ["name", "arguments"]
    if parallel:
        properties["id"] = {"type": "string", "minLength": 4}
        required.append("id")
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": required, **CLOSED}
    description = tool.get("function", tool).get("description")
    if description is not None:
        schema["description"] = description
    return schema


class _Start(State):
    """Held until the first non-blank character says whether the answer is a JSON object."""

    def step(self, d: Driver) -> bool:
        stripped = d.buf.lstrip()
        if not stripped:
            if d.final and d.buf:
                d.state = RestIsContent()
                return True
            return False
        if stripped[0] != "{":
            d.state = RestIsContent()
            return True
        d.begin_tentative()
        d.state = JsonState(_AnswerSink(), lambda: SkipSpace(RestIsContent))
        return True


class _AnswerSink(Sink):
    """The answer object: its `tool_call`, `tool_calls` or `response` member, routed as it streams."""

    def __init__(self) -> None:
        self._member: Sink | None = None
        self._answered = False

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        for piece in pieces:
            if piece.path:
                if self._member is not None:
                    self._member.pieces(d, [piece])
            elif piece.kind is Kind.KEY:
                self._end_member(d)
                self._member = self._sink_for(piece.raw)
            elif piece.kind is Kind.CLOSE:
                self._end_member(d)

    def end(self, d: Driver) -> None:
        if not self._answered:
            raise ParseFailure("expected 'tool_call', 'tool_calls' or 'response' in JSON")

    def _end_member(self, d: Driver) -> None:
        if self._member is not None:
            self._member.end(d)
            self._member = None
            self._answered = True

    @staticmethod
    def _sink_for(key: str) -> Sink | None:
        if key == "tool_call":
            return CallObjectSink(_KEYS, ("tool_call",))
        if key == "tool_calls":
            return CallArraySink(_KEYS, ("tool_calls",))
        if key == "response":
            return _ResponseSink()
        return None


class _ResponseSink(Sink):
    """A string response streams as content; any other value is content as indented JSON at its end."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._is_string = False

    def pieces(self, d: Driver, pieces: list[Piece]) -> None:
        for piece in pieces:
            if len(piece.path) == 1 and piece.kind is Kind.STRING_OPEN:
                self._is_string = True
                d.commit()
            elif self._is_string:
                d.emit.content(piece.raw)
            else:
                self._text.append(piece.text)

    def end(self, d: Driver) -> None:
        if not self._is_string:
            d.commit()
            d.emit.content(json.dumps(json.loads("".join(self._text)), indent=2, ensure_ascii=False))
