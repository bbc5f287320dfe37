"""Mistral Nemo: `[TOOL_CALLS][{"name": ..., "arguments": {...}, "id": "a1b2c3d4e"}, ...]`.

Content before the marker, then one JSON array of calls. Nemo's template wants ids of 9 letters and
digits, so generated ids have that shape (the model's own id is used when it comes before the name).
Newer Mistral templates (`[TOOL_CALLS]name[ARGS]{...}`) are a different format and are not detected
as this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    CallArraySink,
    CallKeys,
    ContentState,
    DriverFormat,
    JsonState,
    Marker,
    RestIsContent,
    SkipSpace,
    State,
)
from engine.text.tool_calls.syntax import CLOSED, Json, Lit, ToolGrammar, Trigger, any_of, seq

MARKER = "[TOOL_CALLS]"
_KEYS = CallKeys(id=("id",))


class MistralNemo(DriverFormat):
    name = "Mistral Nemo"
    preserved_tokens = (MARKER,)
    id_length = 9

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return ContentState([Marker(MARKER, _calls)])

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        calls = [_call_schema(t) for t in choice.tools]
        array: dict[str, Any] = {"type": "array", "items": any_of(calls), "minItems": 1}
        if not parallel_tool_calls:
            array["maxItems"] = 1
        root = seq(Lit(MARKER), Json(array))
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=(Trigger("word", MARKER),))


def _calls() -> State:
    return JsonState(CallArraySink(_KEYS), lambda: SkipSpace(RestIsContent))


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    properties = {
        "name": {"type": "string", "const": tool_name(tool)},
        "arguments": tool_parameters(tool),
        "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"},
    }
    return {"type": "object", "properties": properties, "required": ["name", "arguments", "id"], **CLOSED}
