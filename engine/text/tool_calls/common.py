"""The types every tool-call format shares: calls, stream deltas, tool choice, and the format interface."""

from __future__ import annotations

import secrets
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from engine.api import ReasoningTags, ToolCall, ToolCallDelta, add_tool_call_steps
from engine.text.tool_calls.syntax import ToolGrammar

IdFactory = Callable[[], str]
ToolChoiceMode = Literal["auto", "required", "none"]

_ALNUM = string.ascii_letters + string.digits


def random_id(length: int = 32) -> IdFactory:
    """llama-server's tool-call ids: random letters and digits (32 of them; Mistral's template wants 9)."""
    return lambda: "".join(secrets.choice(_ALNUM) for _ in range(length))


def sequential_ids(prefix: str = "call_") -> IdFactory:
    """Deterministic ids (call_0, call_1, ...), for tests and reproducible runs."""
    counter = iter(range(1 << 62))
    return lambda: f"{prefix}{next(counter)}"


@dataclass(frozen=True)
class ParseDelta:
    """What one push (or the flush) makes certain: content that can no longer be part of a call marker,
    reasoning found inside the format's own structure (GPT-OSS channels), and tool-call deltas in order
    (consecutive steps of the same call are merged into one delta)."""

    content: str = ""
    reasoning: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def __add__(self, later: ParseDelta) -> ParseDelta:
        """This delta followed by a later one (its call steps are not merged with these)."""
        return ParseDelta(
            self.content + later.content, self.reasoning + later.reasoning, self.tool_calls + later.tool_calls
        )


@dataclass
class ParsedMessage:
    """The accumulation of a stream of ParseDeltas: what a non-streamed reply carries."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def add(self, delta: ParseDelta) -> ParsedMessage:
        self.content += delta.content
        self.reasoning += delta.reasoning
        add_tool_call_steps(self.tool_calls, delta.tool_calls)
        return self


class ToolCallParser(Protocol):
    def push(self, text: str) -> ParseDelta: ...

    def flush(self) -> ParseDelta: ...


@dataclass(frozen=True)
class ToolChoice:
    """A request's tool_choice, resolved against its tools: the mode and the tools the model may call."""

    mode: ToolChoiceMode
    tools: tuple[Mapping[str, Any], ...]

    @classmethod
    def resolve(cls, tool_choice: Any, tools: Sequence[Mapping[str, Any]] | None) -> ToolChoice:
        """OpenAI's tool_choice: "auto" (the default), "none", "required", or {"type": "function",
        "function": {"name": ...}}, which is "required" restricted to that tool."""
        functions = tuple(t for t in tools or () if t.get("type") == "function" and "function" in t)
        if tool_choice is None or tool_choice in ("auto", "none", "required"):
            mode = tool_choice or "auto"
            return cls(mode if functions else "none", functions)  # type: ignore[arg-type]
        if isinstance(tool_choice, Mapping) and isinstance(tool_choice.get("function"), Mapping):
            name = tool_choice["function"].get("name")
            named = tuple(t for t in functions if t["function"].get("name") == name)
            if not named:
                raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
            return cls("required", named)
        raise ValueError('tool_choice must be "auto", "none", "required" or {"type": "function", ...}')


def function_of(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def tool_name(tool: Mapping[str, Any]) -> str:
    return str(function_of(tool)["name"])


def tool_parameters(tool: Mapping[str, Any]) -> dict[str, Any]:
    """The tool's JSON schema for its arguments (an empty object schema when it has none)."""
    parameters = function_of(tool).get("parameters")
    return dict(parameters) if isinstance(parameters, Mapping) else {"type": "object", "properties": {}}


class ToolCallFormat:
    """One tool-call chat format: how the model writes calls, and what the prompt and grammar need.

    Subclasses set the class attributes and implement `parser` and `grammar`; the rest has defaults that
    suit formats whose template needs no help.
    """

    name: str = ""
    # The format's own thinking tags (None: the template's, as engine.text.reasoning detects them). The
    # reasoning splitter runs before the parser: the parser sees the answer text only.
    reasoning_tags: ReasoningTags | None = None
    # Special tokens the detokenizer must render as text so the parser sees the markers.
    preserved_tokens: tuple[str, ...] = ()
    # Extra stop strings llama.cpp adds for this format (Llama 3's <|eom_id|>).
    extra_stops: tuple[str, ...] = ()
    # How a call id is made when the model's output carries none.
    id_length: int = 32
    # Whether llama-server reads every answer in this format, tools or not (GPT-OSS: an answer is harmony
    # messages whatever the request; its analysis channel is reasoning, its final channel the content).
    parsed_without_tools: bool = False

    def parser(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
    ) -> ToolCallParser:
        """A streaming parser for one answer. `tools` type MiniMax's XML arguments; `new_id` makes the
        ids the output does not carry; `stream_arguments` chooses llama-server's streaming behaviour
        (calls announced early, arguments as they come) or its final parse (calls whole at the end, and
        a broken call makes everything from the first marker content): see stream.py."""
        raise NotImplementedError

    def grammar(self, choice: ToolChoice, parallel_tool_calls: bool) -> ToolGrammar | None:
        """What the grammar builder constrains: None when nothing is (no tools, tool_choice none)."""
        raise NotImplementedError

    def answer_grammar(self) -> ToolGrammar | None:
        """A grammar that lets the model answer but call nothing while its tools stay in the prompt
        (the last round of a server-side tool loop keeps its cached prefix so); None where the format
        has no such form, and the tools are then left out of the prompt instead."""
        return None

    def parse(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
    ) -> tuple[str, list[ToolCall]]:
        """The non-streamed result: by construction the accumulation of the stream (with the same
        `stream_arguments`), for any chunking."""
        message = self.parse_message(text, tools, new_id, stream_arguments)
        return message.content, message.tool_calls

    def parse_message(
        self,
        text: str,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
    ) -> ParsedMessage:
        parser = self.parser(tools, new_id, stream_arguments)
        return ParsedMessage().add(parser.push(text)).add(parser.flush())

    def new_id(self) -> IdFactory:
        return random_id(self.id_length)

    # -- the prompt side --------------------------------------------------------------------------

    def prepare_messages(self, messages: list[dict], tools: Sequence[Mapping[str, Any]]) -> list[dict]:
        """Messages as this format's template wants them (before ChatTemplate's own polyfills)."""
        return messages

    def template_context(self, tools: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Extra template variables llama.cpp sets for this format."""
        return {}

    def finish_prompt(
        self, template_source: str, prompt: str, add_generation_prompt: bool, enable_thinking: bool = True
    ) -> str:
        """What llama.cpp changes in the rendered prompt (known template bugs, thinking switched off)."""
        return prompt
