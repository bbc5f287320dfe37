"""What constrains a request's answer, in the grammar engine's terms: its own GBNF grammar (lazy, with
llama-server's triggers) or JSON schema, or its tools' calls in the model's tool-call format.

server/chat/structured.py decides which applies; this module spells it for engine/grammar.py, and says
how an answer with tools is read back for calls (`ToolPlan.parsing`), so that the request layer names
no engine module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from engine.api import ToolCallSpec
from engine.grammar import GrammarError, GrammarSpec, Trigger
from engine.schema_lark import schema_lark
from engine.text.tool_calls import ToolCallFormat, ToolChoice
from engine.tool_grammar import tool_grammar_spec
from server.http import errors
from server.model.gbnf import gbnf_spec
from server.model.llama_schema import SchemaError, llama_cpp_schema


@dataclass(frozen=True)
class ToolPlan:
    """A chat request's tools as its model's format handles them (None on a request without tools)."""

    format: ToolCallFormat
    tools: list[dict[str, Any]]
    parsing: ToolCallSpec
    grammar: GrammarSpec | None


def plan_tools(
    fmt: ToolCallFormat,
    special_tokens: dict[str, int],
    tools: list[dict[str, Any]],
    choice: Any,
    parallel: bool,
    streamed: bool,
    answer_only: bool,
    describes_tools: bool = True,
) -> ToolPlan | None:
    """How the tools are offered and read back; None when there are none (or tool_choice none: the tools
    are then left out of the prompt too, so nothing invites a call). `answer_only` (the tool loop's last
    round) keeps the tools in the prompt under the format's answer-only grammar, where it has one, and
    is tool_choice none where it has not. `describes_tools` False (a template with no tool support:
    SmolLM2's, Gemma 3's): under tool_choice auto the tools are left out as llama-server 0c1e570 leaves
    them (its chat params render such a template without them and read the answer as text); a request
    that demands a call (`required`, a named function) gets llama.cpp's generic JSON format under its
    grammar, a valid call, which llama-server cannot give."""
    resolved = ToolChoice.resolve(choice, tools)
    answer = fmt.answer_grammar() if answer_only else None
    if resolved.mode == "none" or (answer_only and answer is None):
        return None
    if resolved.mode == "auto" and not describes_tools:
        return None
    # The grammar reads each tool's parameters as llama.cpp does; the prompt and the parser keep them as sent.
    calls = answer if answer_only else fmt.grammar(ToolChoice.resolve(choice, grammar_tools(tools)), parallel)
    grammar = tool_grammar_spec(calls, special_tokens) if calls is not None else None
    # A whole reply gets llama-server's final parse (a broken call stays content); a stream its
    # streaming parse (calls announced as they start). An answer-only round holds no call: its answer
    # is read as it streams, so one cut by max_tokens is still the answer's text, not its JSON.
    parsing = ToolCallSpec(
        fmt.name, tuple(tools), streamed or answer_only, preserved=preserved_ids(fmt, special_tokens)
    )
    return ToolPlan(fmt, tools, parsing, grammar)


def preserved_ids(fmt: ToolCallFormat, special_tokens: dict[str, int]) -> tuple[int, ...]:
    """The ids of the format's markers that are special tokens of this vocabulary (rendered as text in
    the answer so its parser sees them, as llama-server renders its preserved tokens)."""
    return tuple(special_tokens[t] for t in fmt.preserved_tokens if t in special_tokens)


def gbnf(grammar: str, triggers: list[dict[str, Any]]) -> GrammarSpec:
    """A GBNF grammar as llama.cpp reads it (server/model/gbnf.py); with llama-server's
    `grammar_triggers`, lazy (400 naming a malformed one, or a grammar llama.cpp refuses)."""
    try:
        parsed = [Trigger.from_llama(t) for t in triggers]
    except GrammarError as exc:
        raise errors.invalid_request(f"'grammar_triggers': {exc}") from None
    try:
        return gbnf_spec(grammar, parsed)
    except GrammarError as exc:
        raise errors.invalid_request(f"'grammar': {exc}") from None


def json_schema(schema: dict[str, Any], field: str, strict: bool = False) -> GrammarSpec:
    """A request's answer schema with llama.cpp's meaning (OpenAI's with `strict`); 400 naming `field`
    for a schema llama.cpp refuses."""
    try:
        return schema_spec(schema, strict)
    except SchemaError as exc:
        raise errors.invalid_request(f"'{field}': invalid JSON schema {exc}") from None


def schema_spec(schema: Any, strict: bool = False, request: bool = True) -> GrammarSpec:
    """The grammar of a schema: llama.cpp's, written as Lark with llama.cpp's whitespace
    (engine/schema_lark.py), or with `strict` OpenAI's JSON Schema as llguidance compiles it.
    `request`: a request's schema (`{}` any object), not `-j`'s (`{}` any value). SchemaError when
    llama.cpp refuses it."""
    if strict:
        return GrammarSpec.json_schema(llama_cpp_schema(schema, strict=True))
    return GrammarSpec.lark(schema_lark(llama_cpp_schema(schema, request=request)))


def grammar_tools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tools with their parameters as the call grammar reads them (server/model/llama_schema.py):
    llama.cpp's meaning, or OpenAI's for a `strict` function; 400 for parameters llama.cpp refuses."""
    rewritten = []
    for tool in tools:
        function = tool.get("function", tool)
        parameters = function.get("parameters")
        if isinstance(parameters, dict):
            try:
                # $defs names unique per tool: the calls' grammar holds every tool's schema
                schema = llama_cpp_schema(
                    parameters, function.get("strict") is True, False, _defs_prefix(function)
                )
            except SchemaError as exc:
                raise errors.invalid_request(
                    f"'tools': {function.get('name')}: invalid JSON schema {exc}"
                ) from None
            function = {**function, "parameters": schema}
            tool = {**tool, "function": function} if "function" in tool else function
        rewritten.append(tool)
    return rewritten


def _defs_prefix(function: dict[str, Any]) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", str(function.get("name", ""))) + "."
