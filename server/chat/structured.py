"""Structured output and tool calls for one request: what constrains its answer, how the answer is read
for tool calls, and how the chat is rendered for the model's tool-call format.

A request has at most one constraint: `grammar` (GBNF), `json_schema`, `response_format`, or the
grammar of its tools' calls. The grammar is compiled here, before any SSE byte, so a grammar the engine
cannot use is a 400 naming its field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.api import ToolCallSpec
from engine.grammar import CompiledGrammar, GrammarError, GrammarSpec, Trigger
from engine.text.tool_calls import ToolCallFormat, ToolChoice
from engine.tool_grammar import tool_grammar_spec
from server.chat.schemas import ChatCompletionRequest, GenerationFields
from server.http import errors
from server.model.service import ModelService


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools as its model's format handles them (None on a request without tools)."""

    format: ToolCallFormat
    tools: list[dict[str, Any]]
    parsing: ToolCallSpec
    grammar: GrammarSpec | None


def constraint(body: GenerationFields) -> tuple[GrammarSpec, str] | None:
    """The grammar a request's own fields ask for, and the field that asked."""
    if body.grammar is not None:
        try:
            triggers = (
                [Trigger.from_llama(t) for t in body.grammar_triggers or ()] if body.grammar_lazy else []
            )
        except GrammarError as exc:
            raise errors.invalid_request(f"'grammar_triggers': {exc}") from None
        return GrammarSpec.gbnf(body.grammar, triggers), "grammar"
    schema = body.answer_schema()
    if schema is None:
        return None
    field = "json_schema" if body.json_schema is not None else "response_format"
    return GrammarSpec.json_schema(schema), field


def tool_plan(svc: ModelService, body: ChatCompletionRequest, answer_only: bool = False) -> ToolPlan | None:
    """How the request's tools are offered and read back; None when there are none (or tool_choice none:
    the tools are then left out of the prompt too, so nothing invites a call). `answer_only` (the tool
    loop's last round) keeps the tools in the prompt under the format's answer-only grammar, where it
    has one, and is tool_choice none where it has not."""
    tools = body.tool_dicts()
    choice = ToolChoice.resolve(body.tool_choice_value(), tools)
    fmt = svc.tool_format()
    answer = fmt.answer_grammar() if answer_only else None
    if choice.mode == "none" or (answer_only and answer is None):
        return None
    if constraint(body) is not None:
        raise errors.invalid_request(
            "'tools' cannot be combined with grammar, json_schema or response_format"
        )
    calls = answer if answer_only else fmt.grammar(choice, body.parallel_tool_calls)
    grammar = tool_grammar_spec(calls, svc.special_tokens()) if calls is not None else None
    # A whole reply gets llama-server's final parse (a broken call stays content); a stream its
    # streaming parse (calls announced as they start). An answer-only round holds no call: its answer
    # is read as it streams, so one cut by max_tokens is still the answer's text, not its JSON.
    parsing = ToolCallSpec(fmt.name, tuple(tools), stream_arguments=body.stream or answer_only)
    return ToolPlan(fmt, tools, parsing, grammar)


async def answer_grammar(
    svc: ModelService, body: GenerationFields, tools: ToolPlan | None = None
) -> CompiledGrammar | None:
    """The compiled grammar of the request (its constraint, or its tools' calls); 400 naming the field."""
    asked = constraint(body)
    if tools is not None and tools.grammar is not None:
        asked = (tools.grammar, "tools")
    if asked is None:  # --grammar or -j, compiled at load, constrains requests without their own or tools
        return svc.default_grammar() if tools is None else None
    spec, field = asked
    return await svc.compile_grammar(spec, field)
