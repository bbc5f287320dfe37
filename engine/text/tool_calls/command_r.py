"""Command R7B: `<|START_THINKING|>` reasoning, then an action or a response.

    <|START_THINKING|>I should look it up.<|END_THINKING|>
    <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "get_weather", "parameters": {...}}]<|END_ACTION|>
    <|START_RESPONSE|>It is sunny.<|END_RESPONSE|>

The model's `tool_call_id` becomes the call's id. A past turn's reasoning goes back to the template as
its `tool_plan` (llama.cpp's adjustment); with thinking off, the prompt closes the thinking block.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from engine.api import ReasoningTags
from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    CallArraySink,
    CallKeys,
    ContentState,
    DriverFormat,
    JsonState,
    Marker,
    SkipSpace,
    State,
    expect,
)
from engine.text.tool_calls.syntax import Json, Lit, Space, ToolGrammar, Trigger, any_of, seq

THINKING = ReasoningTags("<|START_THINKING|>", ("<|END_THINKING|>",))
START_ACTION, END_ACTION = "<|START_ACTION|>", "<|END_ACTION|>"
START_RESPONSE, END_RESPONSE = "<|START_RESPONSE|>", "<|END_RESPONSE|>"
_KEYS = CallKeys(name=("tool_name",), arguments=("parameters",), id=("tool_call_id",))


class CommandR7B(DriverFormat):
    name = "Command R7B"
    reasoning_tags = THINKING
    markup_without_calls = True  # the response markers are taken off every answer
    preserved_tokens = (
        START_ACTION,
        END_ACTION,
        START_RESPONSE,
        END_RESPONSE,
        THINKING.start,
        THINKING.end,
    )

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _content()

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        array: dict[str, Any] = {"type": "array", "items": any_of([_call_schema(t) for t in choice.tools])}
        array["minItems"] = 1
        if not parallel_tool_calls:
            array["maxItems"] = 1
        root = seq(Lit(START_ACTION), Space(), Json(array), Space(), Lit(END_ACTION))
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=(Trigger("word", START_ACTION),))

    def prepare_messages(self, messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
        return [_with_tool_plan(m) for m in messages]

    def finish_prompt(
        self, template_source: str, prompt: str, add_generation_prompt: bool, enable_thinking: bool = True
    ) -> str:
        if enable_thinking:
            return prompt
        if prompt.endswith(THINKING.start):
            return prompt + THINKING.end
        if prompt.endswith("<|CHATBOT_TOKEN|>"):
            return prompt + THINKING.start + THINKING.end
        return prompt


def _with_tool_plan(message: dict) -> dict:
    """A past assistant turn with calls shows its reasoning as the template's `tool_plan`."""
    if not isinstance(message.get("reasoning_content"), str) or not isinstance(
        message.get("tool_calls"), list
    ):
        return message
    adjusted = {k: v for k, v in message.items() if k != "reasoning_content"}
    adjusted["tool_plan"] = message["reasoning_content"]
    return adjusted


def _call_schema(tool: Mapping[str, Any]) -> dict[str, Any]:
    properties = {
        "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
        "tool_name": {"type": "string", "const": tool_name(tool)},
        "parameters": tool_parameters(tool),
    }
    return {
        "type": "object",
        "properties": properties,
        "required": ["tool_call_id", "tool_name", "parameters"],
    }


def _content() -> State:
    # The response markers are dropped; what they wrap is content.
    return ContentState(
        [
            Marker(START_ACTION, _action),
            Marker(START_RESPONSE, _content, tentative=False),
            Marker(END_RESPONSE, _content, tentative=False),
        ]
    )


def _action() -> State:
    return JsonState(
        CallArraySink(_KEYS), lambda: expect(r"\s*" + re.escape(END_ACTION), lambda: SkipSpace(_content))
    )
