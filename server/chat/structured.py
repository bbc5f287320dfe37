"""Structured output and tool calls for one request: what constrains its answer, and how its tools are
offered to the model and read back.

A request has at most one constraint: `grammar` (GBNF), `json_schema`, `response_format`, or the
grammar of its tools' calls. The grammar is compiled here, before any SSE byte, so a grammar the engine
cannot use is a 400 naming its field. server/model/constraints.py spells each in the grammar engine's
terms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from server.chat.schemas import ChatCompletionRequest, GenerationFields
from server.http import errors
from server.model import constraints
from server.model.client import EngineClient
from server.model.constraints import ToolPlan
from server.model.prompts import PromptBuilder

if TYPE_CHECKING:
    from engine.grammar import CompiledGrammar, GrammarSpec


def constraint(body: GenerationFields) -> tuple[GrammarSpec, str] | None:
    """The grammar a request's own fields ask for, and the field that asked."""
    if body.grammar is not None:
        triggers = (body.grammar_triggers or []) if body.grammar_lazy else []
        return constraints.gbnf(body.grammar, triggers), "grammar"
    schema = body.answer_schema()
    if schema is None:
        return None
    field = "json_schema" if body.json_schema is not None else "response_format"
    return constraints.json_schema(schema, field, body.answer_strict()), field


def tool_plan(
    prompts: PromptBuilder, body: ChatCompletionRequest, answer_only: bool = False
) -> ToolPlan | None:
    """How the request's tools are offered and read back (server/model/constraints.py's plan_tools);
    None when there are none. `answer_only`: the tool loop's last round. Tools with a constraint of the
    request's own are a 400."""
    choice = body.tool_choice_value()
    if body.tool_dicts() and choice != "none" and constraint(body) is not None:
        raise errors.invalid_request(
            "'tools' cannot be combined with grammar, json_schema or response_format"
        )
    return prompts.tool_plan(
        body.tool_dicts(),
        choice,
        body.parallel_tool_calls,
        body.stream,
        answer_only,
        keep_tools=body._keep_tools,
    )


async def answer_grammar(
    client: EngineClient, body: GenerationFields, tools: ToolPlan | None = None
) -> CompiledGrammar | None:
    """The compiled grammar of the request (its constraint, or its tools' calls); 400 naming the field."""
    asked = constraint(body)
    if tools is not None and tools.grammar is not None:
        asked = (tools.grammar, "tools")
    if asked is None:  # --grammar or -j, compiled at load, constrains requests without their own or tools
        return client.default_grammar if tools is None else None
    spec, field = asked
    return await client.compile_grammar(spec, field)
