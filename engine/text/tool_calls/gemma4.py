"""Gemma 4: a thinking channel and `<|tool_call>` calls in its own object notation (gemma4_args.py):

    <|channel>thought
    Weather wanted.<channel|>On it.<|tool_call>call:get_weather{city:<|"|>Paris<|"|>}<tool_call|>

As llama.cpp reads it (common/parsers/gemma4.cpp): the reasoning splitter takes the opening thought
block (`reasoning_tags`), later `<|channel>thought...<channel|>` blocks are reasoning too (stray
`<|channel>` marks before one are dropped), the content runs up to a mark, and a lone `<channel|>` ends
the answer's content: what follows is dropped, except calls. After the calls nothing more is read.

On the prompt side (llama.cpp's, tools or not): past calls' arguments go to the template as objects,
a prompt that ends on a closed turn where a generation prompt was asked for gets `<|turn>model\\n`, and
a continued message is written in the thought channel. The older template (no "OpenAI Chat
Completions" branch: the -interleaved one) gets each call turn, its results and the answer after them
folded into one assistant message with `tool_responses`, as llama.cpp folds them.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.reasoning import partial_suffix
from engine.text.tool_calls.common import Prefill, ToolChoice, tool_name
from engine.text.tool_calls.gemma4_args import Arguments, object_rule
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
from engine.text.tool_calls.syntax import Lit, Rep, ToolGrammar, Trigger, alt, seq

CHANNEL, CHANNEL_END = "<|channel>", "<channel|>"
CALL, CALL_END = "<|tool_call>", "<tool_call|>"
TURN, TURN_END = "<|turn>", "<turn|>"
THOUGHT = ReasoningTags(CHANNEL + "thought", (CHANNEL_END,))
MODEL_TURN = TURN + "model\n"
NEW_TEMPLATE_SIGN = "{#- OpenAI Chat Completions:"


class Gemma4(DriverFormat):
    reasoning_tags = THOUGHT
    preserved_tokens = (CHANNEL, CHANNEL_END, CALL, CALL_END, TURN)
    markup_without_calls = True  # thought blocks and stray channel marks are read on every answer
    prepares_messages_without_tools = True  # object arguments, the folded turns, the model turn

    def __init__(self, fold_tool_responses: bool = False) -> None:
        self.fold_tool_responses = fold_tool_responses
        self.name = "Gemma 4 (folded tool responses)" if fold_tool_responses else "Gemma 4"

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        return _Start(frozenset(tool_name(t) for t in tools))

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        names = alt(*[Lit(tool_name(t)) for t in choice.tools])
        one = seq(Lit(CALL + "call:"), names, object_rule(), Lit(CALL_END))
        root = seq(one, Rep(one)) if parallel_tool_calls else one
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=(Trigger("word", CALL),))

    # -- the prompt side --------------------------------------------------------------------------

    def prepare_messages(self, messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
        messages = [_with_object_arguments(m) for m in messages]
        return fold_tool_responses(messages) if self.fold_tool_responses else messages

    def finish_prompt(
        self, template_source: str, prompt: str, add_generation_prompt: bool, enable_thinking: bool = True
    ) -> str:
        """A turn the template closed after tool results asks for the model's turn to be opened."""
        if add_generation_prompt and prompt.endswith(TURN_END + "\n"):
            return prompt + MODEL_TURN
        return prompt

    def continue_prompt(
        self, prompt: str, generation_prompt: str, prefill: Prefill, tags: ReasoningTags | None
    ) -> tuple[str, str]:
        """The model's turn (unless it is open already), then the thought channel with the reasoning
        and, for content, its end and the content."""
        base = prompt[: len(prompt) - len(generation_prompt)]
        if base.endswith(TURN_END + "\n"):
            base += MODEL_TURN
        text = THOUGHT.start + "\n" + prefill.reasoning
        if prefill.mode == "content":
            text += CHANNEL_END + prefill.content
        return base, text


def detect(template_source: str) -> Gemma4 | None:
    """llama.cpp's sign of a Gemma 4 template, and whether it is the older one."""
    if "'<|tool_call>call:'" not in template_source:
        return None
    return Gemma4(fold_tool_responses=NEW_TEMPLATE_SIGN not in template_source)


# -- the prompt's messages ----------------------------------------------------------------------------


def _with_object_arguments(message: dict) -> dict:
    """Calls' JSON-text arguments parsed (the template reads their members; llama.cpp parses them)."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    return {**message, "tool_calls": [_parsed(call) for call in calls]}


def _parsed(call: Any) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        return {**call, "function": {**function, "arguments": json.loads(function["arguments"])}}
    except json.JSONDecodeError:
        return call


def fold_tool_responses(messages: list[dict]) -> list[dict]:
    """Each assistant turn with calls, the tool results after it and a plain answer after those, as one
    assistant message with `tool_calls`, `tool_responses` ({name, response}: a result that is JSON
    text parsed, named by its call) and the answer's `content` (llama.cpp's older-template fold)."""
    folded: list[dict] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        i += 1
        if message.get("role") != "assistant" or not message.get("tool_calls"):
            folded.append(message)
            continue
        calls = list(message["tool_calls"])
        turn: dict[str, Any] = {"role": "assistant", "tool_calls": calls}
        if isinstance(message.get("reasoning_content"), str):
            turn["reasoning_content"] = message["reasoning_content"]
        responses = []
        while i < len(messages) and messages[i].get("role") == "tool":
            responses.append(
                _response(messages[i], calls[len(responses)] if len(responses) < len(calls) else {})
            )
            i += 1
        if responses:
            turn["tool_responses"] = responses
        after = messages[i] if i < len(messages) else {}
        if after.get("role") == "assistant" and not after.get("tool_calls") and after.get("content"):
            turn["content"] = after["content"]
            i += 1
        folded.append(turn)
    return folded


def _response(message: dict, call: Any) -> dict:
    content = message.get("content")
    if isinstance(content, str):
        with contextlib.suppress(json.JSONDecodeError):
            content = json.loads(content)
    function = call.get("function") if isinstance(call, dict) else None
    name = function.get("name", "") if isinstance(function, dict) else ""
    return {"name": name or message.get("tool_call_id", ""), "response": content}


# -- the parser side ----------------------------------------------------------------------------------


class _Start(State):
    """The content state, with the call mark only where calls are read."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def step(self, d: Driver) -> bool:
        d.state = _content(self.names, d.reading.calls)
        return True


def _content(names: frozenset[str], calls: bool) -> State:
    markers = [
        Marker(CHANNEL, lambda: _thought(names, calls), tentative=False),
        Marker(CHANNEL_END, lambda: _rest(names, calls), tentative=False),
    ]
    if calls:
        markers.append(Marker(CALL, lambda: _call(names)))
    return ContentState(markers)


def _thought(names: frozenset[str], calls: bool) -> State:
    """After `<|channel>`: more of them, then `thought` and the block; anything else ends the content."""

    def opened(d: Driver, match: regex.Match[str]) -> State:
        return _Thought(lambda: _content(names, calls), raw=not d.reading.extract_reasoning)

    return PatternState(
        r"(?:" + re.escape(CHANNEL) + r")*thought", opened, otherwise=lambda: _rest(names, calls)
    )


class _Thought(State):
    """A thought block's text up to `<channel|>`: reasoning, or (reasoning_format none) raw content."""

    def __init__(self, then: Next, raw: bool) -> None:
        self.then, self.raw = then, raw
        self._started = False

    def step(self, d: Driver) -> bool:
        if not self._started:
            if self.raw:
                d.emit.content(THOUGHT.start)
            elif not d.buf.lstrip() and not d.final:
                return False  # the whitespace after `thought` is not the block's text
            else:
                d.consume(len(d.buf) - len(d.buf.lstrip()))
            self._started = True
            return True
        at = d.buf.find(CHANNEL_END)
        if at >= 0:
            self._emit(d, d.consume(at) + (CHANNEL_END if self.raw else ""))
            d.consume(len(CHANNEL_END))
            d.state = self.then()
            return True
        keep = partial_suffix(d.buf, (CHANNEL_END,))
        if keep == len(d.buf):
            return False
        self._emit(d, d.consume(len(d.buf) - keep))
        return True

    def _emit(self, d: Driver, text: str) -> None:
        if self.raw:
            d.emit.content(text)
        else:
            d.emit.reasoning(text)


def _rest(names: frozenset[str], calls: bool) -> State:
    """After a lone `<channel|>` (or a `<|channel>` that opens no thought), and after the calls: the text
    is dropped, up to a call where calls are read (llama.cpp's parser scans to the first one)."""
    return ContentState([Marker(CALL, lambda: _call(names))] if calls else [], discard=True)


def _call(names: frozenset[str]) -> State:
    def opened(d: Driver, match: regex.Match[str]) -> State:
        name = match.group(1)
        if names and name not in names:
            raise ParseFailure(f"no tool is named {name!r}")
        d.emit.open_call(name)
        d.commit()
        after = lambda: SkipSpace(lambda: _rest(names, True))  # noqa: E731
        return Arguments(lambda: expect(re.escape(CALL_END), after))

    return PatternState(r"call:([^{]+)(?=\{)", opened)
