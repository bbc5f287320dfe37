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
class Prefill:
    """The assistant message a reply continues (an assistant prefill, llama-server's
    continue_final_message): its reasoning and content, and which of them the model goes on with
    ("content", or "reasoning" while the message has reasoning and no content yet)."""

    reasoning: str = ""
    content: str = ""
    mode: Literal["content", "reasoning"] = "content"

    @classmethod
    def of(cls, message: Mapping[str, Any], asked: bool | str | None) -> Prefill:
        """llama.cpp's resolution: "content" and "reasoning_content" name the part; otherwise (true, or
        the prefill heuristic) the reasoning while the message has reasoning and no content."""
        reasoning = str(message.get("reasoning_content") or "")
        content = str(message.get("content") or "")
        if asked == "reasoning_content" or (asked not in ("content",) and reasoning and not content):
            return cls(reasoning, content, "reasoning")
        return cls(reasoning, content, "content")


@dataclass(frozen=True)
class AnswerReading:
    """How one answer is read besides its calls: `calls` (False: the request has no tools, or
    tool_choice none: call markup stays content, the format's other markup is still read),
    `extract_reasoning` (False: reasoning_format none, a channel's reasoning stays raw content) and
    `fenced_json` (the request has an answer schema: a ```json fence around the answer is taken off,
    as llama.cpp's parser does)."""

    calls: bool = True
    extract_reasoning: bool = True
    fenced_json: bool = False


READ_ALL = AnswerReading()  # calls and reasoning read, no schema


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
    # Whether the format has markup to read in an answer without calls (channels, headers): then its
    # parser runs on every chat answer, as llama-server's does; otherwise only when calls may come.
    markup_without_calls: bool = False
    # Whether an answer under a schema may come in a ```json fence (llama.cpp's generic answer rule).
    fenced_json_answers: bool = True
    # Whether `prepare_messages` applies to a chat without tools too (GPT-OSS: past reasoning as `thinking`).
    prepares_messages_without_tools: bool = False

    def parser(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
        reading: AnswerReading = READ_ALL,
    ) -> ToolCallParser:
        """A streaming parser for one answer. `tools` type MiniMax's XML arguments; `new_id` makes the
        ids the output does not carry; `stream_arguments` chooses llama-server's streaming behaviour
        (calls announced early, arguments as they come) or its final parse (calls whole at the end, and
        a broken call makes everything from the first marker content): see stream.py. `reading`: what
        else the request asks of the reading (AnswerReading)."""
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

    def answer_parser(
        self,
        tools: Sequence[Mapping[str, Any]] = (),
        new_id: IdFactory | None = None,
        stream_arguments: bool = True,
        reading: AnswerReading = READ_ALL,
    ) -> ToolCallParser | None:
        """The parser of one chat answer (None: the text is all content): the format's, when calls may
        come or the format has markup of its own, behind a ```json fence remover under a schema."""
        raise NotImplementedError

    def continue_prompt(
        self, prompt: str, generation_prompt: str, prefill: Prefill, tags: ReasoningTags | None
    ) -> tuple[str, str]:
        """The prompt of a reply that continues `prefill`: (what comes before the continued message,
        the message's text as the model goes on from it); the answer is read from the second part on.
        llama.cpp's rule for templates it reads by their markers: the generation prompt up to its
        thinking tag, then the tag, the reasoning, and for content the end tag and the content."""
        if tags is None:
            return prompt, prefill.content
        at = generation_prompt.find(tags.start)
        base = prompt if at < 0 else prompt[: len(prompt) - len(generation_prompt) + at]
        text = tags.start + prefill.reasoning
        if prefill.mode == "content":
            text += tags.end + prefill.content
        return base, text

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
