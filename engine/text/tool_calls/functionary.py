"""Functionary v3.2: `>>>recipient\n` before each message; plain content goes to `all`.

    all\nHere is the answer              (the generation prompt ends with `>>>`, so the first header has
    get_weather\n{"city": "Paris"}        none; later ones do: `>>>get_weather\n{...}`)
    python\nprint("raw code")             (the python tool may take raw code: arguments {"code": ...})

As in llama.cpp, a header counts when the JSON arguments follow it (`{` right after the newline), or for
`python` anything; `all` headers are dropped and their text is content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import regex

from engine.api import ReasoningTags
from engine.text.tool_calls.common import Prefill, ToolChoice, tool_name, tool_parameters
from engine.text.tool_calls.stream import (
    ArgumentsSink,
    Commit,
    ContentState,
    Driver,
    DriverFormat,
    GiveBack,
    JsonState,
    Marker,
    PatternState,
    SkipSpace,
    State,
    Tentative,
)
from engine.text.tool_calls.syntax import Json, Lit, Node, Regex, Space, ToolGrammar, Trigger, alt, calls, seq

SEPARATOR = ">>>"
# A header at the very start (the prompt wrote its `>>>`) and after a later `>>>`.
_FIRST_HEADER = r"(?:(all)\n|(python)\n(?=[^{])|(\w+)\n(?=\{))"
_HEADER = r"(?:(all)\n|(python)\n|(\w+)\n(?=\{))"


class FunctionaryV32(DriverFormat):
    name = "Functionary v3.2"
    preserved_tokens = ("<|end_header_id|>",)
    markup_without_calls = True  # the `all` header is taken off every answer, as llama-server does

    def continue_prompt(
        self, prompt: str, generation_prompt: str, prefill: Prefill, tags: ReasoningTags | None
    ) -> tuple[str, str]:
        """The generation prompt ends with `>>>`: the continued message is an `all` one."""
        return prompt, "all\n" + prefill.content

    def start_state(self, tools: Sequence[Mapping[str, Any]]) -> State:
        start = Tentative(
            lambda: PatternState(_FIRST_HEADER, _first_header, otherwise=lambda: Commit(_content))
        )
        return start

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        if choice.mode == "none":
            return None
        first = alt(*[_call(t) for t in choice.tools])
        root = calls(first, parallel_tool_calls, separator=seq(Space(), Lit(SEPARATOR)))
        triggers = tuple(Trigger("pattern_full", _trigger(tool_name(t))) for t in choice.tools)
        return ToolGrammar(root, lazy=choice.mode == "auto", triggers=triggers)


def _call(tool: Mapping[str, Any]) -> Node:
    arguments: Node = Json(tool_parameters(tool))
    if tool_name(tool) == "python":
        arguments = alt(arguments, Regex(r"[^{][\s\S]*"))
    return seq(Lit(tool_name(tool) + "\n"), arguments)


def _trigger(name: str) -> str:
    """The call's header at the start or after a `>>>`; the grammar starts at the name (llama.cpp's
    group also takes in the text before, which its grammar would then refuse)."""
    arguments = r"[\s\S]*" if name == "python" else r"\{[\s\S]*"
    return r"(?:[\s\S]+?>>>)?(" + regex.escape(name) + r"\n)" + arguments


def _content() -> State:
    return ContentState([Marker(SEPARATOR, _header)])


def _first_header(d: Driver, match: regex.Match[str]) -> State:
    if match.group(1):
        return Commit(_content)
    if match.group(2):
        d.emit.open_call("python")
        return _RawPython()
    return _arguments(d, match.group(3))


def _header() -> State:
    """After `>>>`: a header llama.cpp's parser knows, or else `>>>` was content (a Python prompt...)."""
    return PatternState(_HEADER, _after_header, otherwise=lambda: GiveBack(_content))


def _after_header(d: Driver, match: regex.Match[str]) -> State:
    if match.group(1):
        return Commit(_content)
    if match.group(2):
        json_arguments = lambda d, m: _arguments(d, "python")  # noqa: E731
        return PatternState(r"(?=\{)", json_arguments, otherwise=lambda: _raw_python(d))
    return _arguments(d, match.group(3))


def _arguments(d: Driver, name: str) -> State:
    d.emit.open_call(name)  # tentative until its JSON begins
    return JsonState(ArgumentsSink(), lambda: SkipSpace(_content))


def _raw_python(d: Driver) -> State:
    d.emit.open_call("python")
    return _RawPython()


class _RawPython(State):
    """The rest of the answer is Python code: arguments {"code": "..."}, streamed as it comes."""

    def __init__(self) -> None:
        self._opened = False

    def step(self, d: Driver) -> bool:
        if not self._opened:
            d.commit()
            d.emit.arguments('{"code":"')
            self._opened = True
            return True
        if d.buf:
            d.emit.arguments(json.dumps(d.consume(len(d.buf)), ensure_ascii=False)[1:-1])
            return True
        if d.final:
            d.emit.arguments('"}')
            d.state = _Done()
            return True
        return False


class _Done(State):
    def step(self, d: Driver) -> bool:
        return False
