"""Hermes 2 Pro, Hermes 3, Qwen 2.5 and Qwen 3: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`.

Any number of calls, each in its own tags, with content before (and, rarely, between) them. As in
llama.cpp's parser the object must start with its name. Qwen 3's `<think>` block is the template's
(engine.text.reasoning finds it). llama.cpp also accepts a few "good bad" variants models produce
(`<function=name>`, bare JSON, code fences); they are not supported here (see the module list in
engine/text/tool_calls/__init__.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    CallKeys,
    CallObjectSink,
    ContentState,
    DriverFormat,
    GiveBack,
    JsonState,
    Marker,
    SkipSpace,
    State,
    expect,
)
from engine.text.tool_calls.syntax import (
    Json,
    Lit,
    Space,
    ToolGrammar,
    Trigger,
    any_of,
    call_object_schema,
    calls,
    seq,
)

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_KEYS = CallKeys(before_name=())


class Hermes2Pro(DriverFormat):
    name = "Hermes 2 Pro"
    preserved_tokens = ("<think>", "</think>", OPEN, CLOSE)

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return self._content()

    def _content(self) -> State:
        return ContentState([Marker(OPEN, self._call)])

    def _call(self) -> State:
        # As in llama.cpp, a call is `<tool_call>` with an object starting with its name; the tag
        # without one is content, and the parse goes on.
        json_call = lambda: JsonState(CallObjectSink(_KEYS), self._close)  # noqa: E731
        return expect(r'(?=\s*\{\s*"name")', json_call, otherwise=lambda: GiveBack(self._content))

    def _close(self) -> State:
        return expect(r"\s*" + CLOSE, lambda: SkipSpace(self._content))

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        schemas = [call_object_schema(tool_name(t), tool_parameters(t)) for t in choice.tools]
        one = seq(Lit(OPEN), Space(), Json(any_of(schemas)), Space(), Lit(CLOSE))
        root = calls(one, parallel_tool_calls, separator=Space())
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=(Trigger("word", OPEN),))
