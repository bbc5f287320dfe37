"""GPT-OSS: OpenAI's harmony format, messages on channels.

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{...}<|call|>
    <|start|>assistant<|channel|>final<|message|>It is sunny.<|end|>

The generation prompt ends with `<|start|>assistant`, so the answer starts at its first channel. The
analysis channel is reasoning: the reasoning splitter takes the opening one (`reasoning_tags`), and the
parser puts later ones into `reasoning`. `final` and `commentary` without a recipient (a preamble) are
content; a recipient `to=functions.NAME`, in the channel or before it, makes the message a call whose
body is the JSON arguments. A message to any other recipient (a built-in tool such as `container.exec`
or `python`, which no one here runs) is dropped, and a stray `<|channel|>commentary to=assistant` before
a header is skipped, as llama.cpp's parser does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.tool_calls.common import Prefill, ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    ArgumentsSink,
    ContentState,
    Driver,
    DriverFormat,
    JsonState,
    Marker,
    ParseFailure,
    PatternState,
    State,
    expect,
)
from engine.text.tool_calls.syntax import Json, Lit, Node, ToolGrammar, Trigger, alt, opt, seq

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
ANALYSIS = ReasoningTags(CHANNEL + "analysis" + MESSAGE, (END,))
_CONSTRAINT = r"(?: (?:<\|constrain\|>)?[a-zA-Z0-9_-]+)?"
_RECIPIENT = r" to=functions\.([^<\s]+)"
_BUILT_IN = r" to=[^<\s]+"  # after the functions.* alternatives: any other recipient
# A message header up to its <|message|>: the recipient is in the role (before the channel) or in it.
_HEADER = (
    r"(?:<\|start\|>assistant)?"
    r"(?:<\|channel\|>commentary to=assistant)?"
    r"(?:"
    + _RECIPIENT
    + r"<\|channel\|>(?:analysis|commentary)"
    + _CONSTRAINT
    + r"|<\|channel\|>(?:analysis|commentary)"
    + _RECIPIENT
    + _CONSTRAINT
    + r"|<\|channel\|>(analysis)"
    + r"|<\|channel\|>(final|commentary)"
    + _CONSTRAINT
    + r"|(?P<built_in>"
    + _BUILT_IN
    + r"<\|channel\|>(?:analysis|commentary)"
    + _CONSTRAINT
    + r"|<\|channel\|>(?:analysis|commentary)"
    + _BUILT_IN
    + _CONSTRAINT
    + r")"
    + r")"
    + r"<\|message\|>"
)


class GptOss(DriverFormat):
    name = "GPT-OSS"
    reasoning_tags = ANALYSIS
    preserved_tokens = (CHANNEL, CONSTRAIN, MESSAGE, START, END)
    markup_without_calls = True  # channels are read on every answer, as llama-server does
    fenced_json_answers = False  # an answer under a schema is the final channel's JSON
    prepares_messages_without_tools = True

    def continue_prompt(
        self, prompt: str, generation_prompt: str, prefill: Prefill, tags: ReasoningTags | None
    ) -> tuple[str, str]:
        """The generation prompt opens the message; the continued one is its analysis, then for
        content a final message (llama.cpp's gpt-oss continuation)."""
        text = ANALYSIS.start + prefill.reasoning
        if prefill.mode == "content":
            text += END + START + "assistant" + CHANNEL + "final" + MESSAGE + prefill.content
        return prompt, text

    def prepare_messages(self, messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
        """An assistant message's reasoning_content as the template's `thinking` (its analysis message),
        and a call's content dropped then (the template refuses both), as llama.cpp does, tools or not."""
        prepared = []
        for message in messages:
            if isinstance(message.get("reasoning_content"), str):
                message = {**message, "thinking": message["reasoning_content"]}
                if message.get("tool_calls"):
                    message.pop("content", None)
            prepared.append(message)
        return prepared

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _message()

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        channel = alt(Lit(CHANNEL + "commentary"), Lit(CHANNEL + "analysis"))
        # The model writes ` <|constrain|>json`; the template renders past calls with ` json`.
        constrain = opt(alt(Lit(" " + CONSTRAIN + "json"), Lit(" json")))
        in_role = [
            seq(Lit(tool_name(t)), channel, constrain, Lit(MESSAGE), _arguments(t)) for t in choice.tools
        ]
        in_channel = [seq(Lit(tool_name(t)), constrain, Lit(MESSAGE), _arguments(t)) for t in choice.tools]
        recipient_in_role = seq(opt(Lit(START + "assistant")), Lit(" to=functions."), alt(*in_role))
        recipient_in_channel = seq(channel, Lit(" to=functions."), alt(*in_channel))
        triggers = (
            Trigger("pattern", r"<\|channel\|>(commentary|analysis) to"),
            Trigger("pattern_full", "^ to"),
            Trigger("pattern", r"<\|start\|>assistant to"),
        )
        root = alt(recipient_in_role, recipient_in_channel)
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=triggers)


def _arguments(tool: Mapping[str, Any]) -> Node:
    return Json(tool_parameters(tool))


def _message() -> State:
    return _NextMessage()


class _NextMessage(State):
    """The next message: its header decides what its body is; text that is no header is content. The
    output may end here."""

    def step(self, d: Driver) -> bool:
        if not d.buf:
            return False
        d.begin_tentative()
        d.state = PatternState(_HEADER, _body)
        return True


class _Raw(State):
    """Markup that stays in the content (reasoning_format none), then the next state."""

    def __init__(self, text: str, then: Callable[[], State]) -> None:
        self.text, self.then = text, then

    def step(self, d: Driver) -> bool:
        d.emit.content(self.text)
        d.state = self.then()
        return True


class _EndOfOutput(State):
    """After a call's arguments: the output ends here, or the parse fails."""

    def step(self, d: Driver) -> bool:
        if d.buf:
            raise ParseFailure("expected <|call|> or the next message after a call's arguments")
        return False


def _body(d: Driver, match: regex.Match[str]) -> State:
    name = match.group(1) or match.group(2)
    ends = [Marker(end, _message, tentative=False) for end in (END, RETURN, CALL)]
    if name and not d.reading.calls:  # a request without tools: a call is dropped, as llama.cpp's
        d.commit()  # parser consumes unsolicited calls
        return ContentState(ends, discard=True)
    if match.group(3) is not None and not d.reading.extract_reasoning:
        d.commit()  # reasoning_format none: the analysis message is content, its markup included
        header = match.group(0)  # less the role's <|start|>assistant, as llama.cpp's parser leaves it
        d.emit.content(header[header.index(CHANNEL) :])
        return ContentState([Marker(END, lambda: _Raw(END, _message), tentative=False)])
    if name:
        d.emit.open_call(name)
        # <|call|> ends the generation (so is seldom in the text: the output may end after the
        # arguments); another message may follow.
        after = r"\s*(?:" + re.escape(CALL) + r"|(?=<\|start\|>))"
        return JsonState(ArgumentsSink(), lambda: expect(after, _message, otherwise=_EndOfOutput))
    d.commit()
    return ContentState(ends, reasoning=match.group(3) is not None, discard=bool(match.group("built_in")))
