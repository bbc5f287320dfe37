"""DeepSeek R1 (and its distills): `<think>` reasoning, then calls in a block of special tokens:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

Distilled models misspell the block's opening token; llama.cpp accepts the variants listed below, and so
does this parser. The official template's prompt needs two fixes llama.cpp makes (`finish_prompt`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.tool_calls.common import ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    ArgumentsSink,
    ContentState,
    Driver,
    DriverFormat,
    JsonState,
    Marker,
    PatternState,
    SkipSpace,
    State,
    Tentative,
    expect,
)
from engine.text.tool_calls.syntax import Json, Lit, Node, Space, ToolGrammar, Trigger, alt, calls, seq

CALLS_BEGIN_VARIANTS = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
)
CALLS_BEGIN, CALLS_END = CALLS_BEGIN_VARIANTS[0], "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL_HEADER = r"\s*(?:" + re.escape(CALL_BEGIN) + r")?function" + re.escape(SEP) + r"([^\n]+)\n```json\n"
_CALL_CLOSE = r"\s*```[\s\r\n]*" + re.escape(CALL_END)
_OUTPUTS_END = "<｜tool▁outputs▁end｜>"
_BROKEN_TEMPLATE_SIGN = "{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}"


class DeepSeekR1(DriverFormat):
    name = "DeepSeek R1"
    reasoning_tags = ReasoningTags("<think>", ("</think>",))
    preserved_tokens = ("<think>", "</think>", CALLS_BEGIN, CALL_BEGIN, SEP, CALL_END, CALLS_END)

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _content()

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        one = alt(*[_call(t) for t in choice.tools])
        begin = alt(*[Lit(v) for v in CALLS_BEGIN_VARIANTS])
        root = seq(begin, calls(one, parallel_tool_calls, separator=Space()), Space(), Lit(CALLS_END))
        triggers = tuple(Trigger("word", v) for v in CALLS_BEGIN_VARIANTS)
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=triggers)

    def finish_prompt(
        self, template_source: str, prompt: str, add_generation_prompt: bool, enable_thinking: bool = True
    ) -> str:
        """llama.cpp's fixes for the official template: close the chat after tool results, and close the
        tool-call block its past calls leave open."""
        if _BROKEN_TEMPLATE_SIGN not in template_source:
            return prompt
        if prompt.endswith(_OUTPUTS_END):
            prompt += "<｜end▁of▁sentence｜>" + ("<｜Assistant｜>" if add_generation_prompt else "")
        return re.sub(
            "(" + re.escape(CALL_END) + r")[\s\r\n]*(<｜tool▁outputs▁begin｜>|<｜User｜>)",
            r"\1" + CALLS_END + r"<｜end▁of▁sentence｜>\2",
            prompt,
        )


def _call(tool: Mapping[str, Any]) -> Node:
    header = Lit(f"{CALL_BEGIN}function{SEP}{tool_name(tool)}\n```json\n")
    return seq(header, Json(tool_parameters(tool)), Space(), Lit("```" + CALL_END))


def _content() -> State:
    return ContentState([Marker(v, _block) for v in CALLS_BEGIN_VARIANTS])


def _block() -> State:
    return PatternState(_CALL_HEADER, _call_arguments)


def _call_arguments(d: Driver, match: regex.Match[str]) -> State:
    d.emit.open_call(match.group(1).strip())
    return JsonState(ArgumentsSink(), lambda: expect(_CALL_CLOSE, _after_call))


def _after_call() -> State:
    """Another call, or the end of the block (and content after it)."""
    return expect(
        r"\s*" + re.escape(CALLS_END), lambda: SkipSpace(_content), otherwise=lambda: Tentative(_block)
    )
