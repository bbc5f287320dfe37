"""What a JSON schema means to Llamba (server/model/llama_schema.py): llama.cpp's meaning, checked on the
grammar each schema compiles to (llguidance over SmolLM2's vocabulary), the rewriting itself, the
tool-call grammars, and `strict` (OpenAI's meaning). llama.cpp's own cases are in
tests/test_llama_cpp_goldens.py; this file holds the rules they do not pin down."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.gguf import GGUFFile
from engine.grammar import GrammarCompiler, GrammarError, GrammarSpec
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import FORMATS
from server.http.errors import APIError
from server.model.constraints import grammar_tools, json_schema, plan_tools
from server.model.llama_schema import SchemaError, llama_cpp_schema, pattern_regex

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "skills": {
            "type": "array",
            "items": {"type": "object", "properties": {"skill": {"type": "string"}}, "required": ["skill"]},
        },
    },
    "required": ["name", "address", "skills"],
}
PERSON_DOC = {"name": "Ada", "address": {"city": "London"}, "skills": [{"skill": "maths"}]}


@pytest.fixture(scope="module")
def compiler(smollm2_gguf: GGUFFile) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(smollm2_gguf))


def accepts(compiler: GrammarCompiler, spec: GrammarSpec, text: str) -> bool:
    matcher = compiler.compile(spec).matcher()
    tokens = compiler.tokenizer.encode(text, add_special=False, parse_special=False)
    return all(matcher.accept(t) for t in tokens) and matcher.eos_allowed


def schema_accepts(compiler: GrammarCompiler, schema: Any, doc: Any, strict: bool = False) -> bool:
    text = doc if isinstance(doc, str) else json.dumps(doc)
    return accepts(compiler, json_schema(schema, "json_schema", strict), text)


# -- objects: closed unless they say otherwise ----------------------------------------------------------


def test_objects_without_the_keyword_refuse_keys_they_do_not_declare(compiler: GrammarCompiler) -> None:
    assert schema_accepts(compiler, PERSON, PERSON_DOC)
    nested = {**PERSON_DOC, "address": {"city": "London", "country": "UK"}}
    in_items = {**PERSON_DOC, "skills": [{"skill": "maths", "skill_expert": True}]}
    at_top = {**PERSON_DOC, "age": 36}
    for doc in (nested, in_items, at_top):
        assert not schema_accepts(compiler, PERSON, doc), doc


def test_additional_properties_true_or_a_schema_still_allows_extra_keys(compiler: GrammarCompiler) -> None:
    open_address = json.loads(json.dumps(PERSON))
    open_address["properties"]["address"]["additionalProperties"] = True
    doc = {**PERSON_DOC, "address": {"city": "London", "country": "UK", "zip": 12345}}
    assert schema_accepts(compiler, open_address, doc)
    typed = json.loads(json.dumps(PERSON))
    typed["properties"]["address"]["additionalProperties"] = {"type": "string"}
    assert schema_accepts(compiler, typed, {**PERSON_DOC, "address": {"city": "London", "country": "UK"}})
    assert not schema_accepts(compiler, typed, doc)  # zip is a number, not a string
    # the extra keys come after the declared ones, and never repeat a declared name
    assert not schema_accepts(compiler, open_address, {**PERSON_DOC, "address": {"x": 1, "city": "L"}})
    twice = '{"name": "Ada", "address": {"city": "L", "city": "M"}, "skills": []}'
    assert not schema_accepts(compiler, open_address, twice)


def test_an_object_without_properties_is_any_object(compiler: GrammarCompiler) -> None:
    assert schema_accepts(compiler, {"type": "object"}, {"any": [1, {"thing": None}]})
    closed_empty = {"type": "object", "properties": {}}
    assert schema_accepts(compiler, closed_empty, {}) and not schema_accepts(compiler, closed_empty, {"a": 1})


def test_required_properties_come_first_each_group_in_declared_order(compiler: GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}, "c": {"type": "integer"}},
        "required": ["c"],
    }
    assert list(llama_cpp_schema(schema)["properties"]) == ["c", "b", "a"]
    assert schema_accepts(compiler, schema, '{"c": 1, "b": 2, "a": 3}')
    assert schema_accepts(compiler, schema, '{"c": 1, "a": 3}')
    assert not schema_accepts(compiler, schema, '{"b": 2, "c": 1}')


def test_a_request_schema_that_is_empty_means_any_object(compiler: GrammarCompiler) -> None:
    assert schema_accepts(compiler, {}, {"a": 1}) and not schema_accepts(compiler, {}, "[1]")
    assert llama_cpp_schema({}, request=False) == {}  # -j {} (and llama.cpp's converter): any value


# -- the other keywords, as llama.cpp reads them ------------------------------------------------------------


def test_one_of_is_any_of_and_its_siblings_are_ignored(compiler: GrammarCompiler) -> None:
    overlapping = {"type": "string", "oneOf": [{"type": "integer"}, {"type": "number"}]}
    limit = 10**16 - 2
    integer = {"type": "integer", "minimum": -limit, "maximum": limit}
    assert llama_cpp_schema(overlapping) == {"anyOf": [integer, {"type": "number"}]}
    assert schema_accepts(compiler, overlapping, "2")


def test_keywords_llama_cpp_does_not_read_are_ignored_not_refused(compiler: GrammarCompiler) -> None:
    schema = {"type": "array", "items": {"type": "string", "format": "x-custom"}, "uniqueItems": True}
    assert schema_accepts(compiler, schema, '["a", "a"]')
    assert schema_accepts(compiler, {"type": "object", "if": {"required": ["a"]}, "then": {}}, {"z": 1})


def test_integers_stop_at_sixteen_digits_and_bounds_round_inwards(compiler: GrammarCompiler) -> None:
    assert schema_accepts(compiler, {"type": "integer"}, "-9999999999999998")
    assert not schema_accepts(compiler, {"type": "integer"}, "10000000000000000")
    bounded = {"type": "integer", "minimum": 1.5, "exclusiveMaximum": 4.5}
    assert llama_cpp_schema(bounded) == {"type": "integer", "minimum": 2, "maximum": 4}


def test_formats_are_llama_cpps_patterns(compiler: GrammarCompiler) -> None:
    date_time = {"type": "string", "format": "date-time"}
    assert schema_accepts(compiler, date_time, '"2024-02-29T12:30:00.123Z"')
    assert not schema_accepts(compiler, date_time, '"2024-02-29T12:30:00.1234Z"')  # 3 fraction digits
    assert schema_accepts(
        compiler, {"type": "string", "format": "uuid4"}, '"12345678-1234-1234-1234-1234567890ab"'
    )


@pytest.mark.parametrize(
    ("pattern", "regex"),
    [
        ("^a.b$", r"^(?:a[^\n\r]b)$"),
        ("^(?:ab)+|c{2,}$", r"^(?:(?:(?:ab))+|(?:c){2,})$"),
        ("^[a-z\\-]{,3}$", r"^(?:(?:[a-z\-]){0,3})$"),
        ("^\\d+$", "^\\d+$"),  # llama.cpp: any string; JSON Schema's reading, which llguidance enforces
        ("a+", "a+"),
        ("^(?=a)a$", None),  # look-ahead: any string, as in llama.cpp
    ],
)
def test_patterns_in_llama_cpps_subset_are_read_as_it_reads_them(pattern: str, regex: str | None) -> None:
    read = pattern_regex(pattern)
    got = (
        read if read is not None else llama_cpp_schema({"type": "string", "pattern": pattern}).get("pattern")
    )
    assert got == regex


def test_schemas_llama_cpp_refuses_are_400s_naming_the_field_and_where() -> None:
    for schema in ({"type": "objekt"}, {"enum": []}, {"anyOf": []}, {"properties": {"a": True}},
                   {"type": "string", "pattern": "^(a$"}, {"$ref": "#/$defs/missing"},
                   {"$ref": "https://example.com/s.json"}, {"type": "array", "maxItems": -1}):  # fmt: skip
        with pytest.raises(SchemaError):
            llama_cpp_schema(schema)
        with pytest.raises(APIError, match="'response_format': invalid JSON schema at #"):
            json_schema(schema, "response_format")


def test_refs_and_recursion_keep_their_meaning(compiler: GrammarCompiler) -> None:
    tree = {
        "$ref": "#/$defs/node",
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "value": {"type": "integer"},
                    "children": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["value"],
            }
        },
    }  # fmt: skip
    doc = {"value": 1, "children": [{"value": 2, "children": []}, {"value": 3}]}
    assert schema_accepts(compiler, tree, doc)
    assert not schema_accepts(compiler, tree, {"value": 1, "children": [{"value": 2, "extra": 0}]})


# -- strict: OpenAI's meaning -------------------------------------------------------------------------------


def test_strict_keeps_json_schemas_meaning_with_closed_objects(compiler: GrammarCompiler) -> None:
    schema = {
        "type": "object",
        "properties": {"when": {"type": "string", "format": "date"}, "n": {"type": "integer"}},
        "required": ["n"],
    }
    assert schema_accepts(compiler, schema, '{"n": 1, "when": "2024-01-31"}')
    assert not schema_accepts(compiler, schema, '{"when": "2024-01-31", "n": 1}')  # llama.cpp: required order
    assert schema_accepts(compiler, schema, '{"when": "2024-01-31", "n": 1}', strict=True)  # declared order
    assert not schema_accepts(compiler, schema, '{"when": "2024-01-31", "n": 1, "x": 2}', strict=True)
    assert not schema_accepts(
        compiler, schema, '{"when": "2024-01-31", "n": 12345678901234567}', strict=False
    )
    assert schema_accepts(compiler, schema, '{"when": "2024-01-31", "n": 12345678901234567}', strict=True)
    # a keyword llguidance cannot enforce is refused, as OpenAI's strict mode refuses it
    with pytest.raises(GrammarError, match="uniqueItems"):
        compiler.compile(json_schema({"type": "array", "uniqueItems": True}, "response_format", strict=True))


# -- tool calls -------------------------------------------------------------------------------------------


def tool(name: str, parameters: dict[str, Any], strict: bool | None = None) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, "parameters": parameters}
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function}


def call_accepted(
    compiler: GrammarCompiler, tools: list[dict], arguments: Any, choice: str = "required"
) -> bool:
    fmt = FORMATS["Hermes 2 Pro"]
    plan = plan_tools(fmt, compiler.special_tokens, tools, choice, False, False, False)
    assert plan is not None and plan.grammar is not None
    call = {"name": tools[0]["function"]["name"], "arguments": arguments}
    return accepts(compiler, plan.grammar, f"<tool_call>\n{json.dumps(call)}\n</tool_call>")


def test_tool_parameters_are_closed_in_the_call_grammar(compiler: GrammarCompiler) -> None:
    weather = tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}})
    assert call_accepted(compiler, [weather], {"city": "Paris"})
    assert not call_accepted(compiler, [weather], {"city": "Paris", "humidity": 80})
    opened = tool("get_weather", {**weather["function"]["parameters"], "additionalProperties": True})
    assert call_accepted(compiler, [opened], {"city": "Paris", "humidity": 80})


def test_tool_parameters_with_refs_compile_inside_the_call_object(compiler: GrammarCompiler) -> None:
    """A tool's $defs sit under the call object's `arguments`; their references still resolve."""
    parameters = {
        "type": "object",
        "properties": {"where": {"$ref": "#/$defs/place"}},
        "required": ["where"],
        "$defs": {
            "place": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        },
    }
    other = tool("other", {**parameters, "$defs": {"place": {"type": "integer"}}})  # same name, other meaning
    tools = [tool("locate", parameters), other]
    assert call_accepted(compiler, tools, {"where": {"city": "Paris"}}, choice="auto")
    assert not call_accepted(compiler, tools, {"where": 3}, choice="auto")
    assert not call_accepted(compiler, tools, {"where": {"city": "Paris", "x": 1}}, choice="auto")


def test_strict_tools_with_the_same_defs_names_keep_their_own(compiler: GrammarCompiler) -> None:
    def with_place(place: dict) -> dict[str, Any]:
        parameters = {
            "type": "object",
            "properties": {"where": {"$ref": "#/$defs/place"}},
            "required": ["where"],
        }
        return {**parameters, "$defs": {"place": place}}

    city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    tools = [
        tool("locate", with_place(city), strict=True),
        tool("other", with_place({"type": "integer"}), strict=True),
    ]
    assert call_accepted(compiler, tools, {"where": {"city": "Paris"}}, choice="auto")
    assert not call_accepted(compiler, tools, {"where": 3}, choice="auto")


def test_grammar_tools_keep_the_prompts_tools_as_sent() -> None:
    weather = tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}, strict=True)
    rewritten = grammar_tools([weather])
    assert rewritten[0]["function"]["parameters"]["additionalProperties"] is False
    assert "additionalProperties" not in weather["function"]["parameters"]
    with pytest.raises(APIError, match="'tools': bad: invalid JSON schema"):
        grammar_tools([tool("bad", {"type": "object", "properties": {"a": {"enum": []}}})])


def test_the_call_grammar_spec_is_the_same_for_the_same_tools(compiler: GrammarCompiler) -> None:
    """Tools come back every turn: the rewritten grammar is deterministic, so its compiled form is cached."""
    fmt = FORMATS["Hermes 2 Pro"]
    plans = [
        plan_tools(fmt, compiler.special_tokens, [tool("f", PERSON)], "auto", True, False, False)
        for _ in "ab"
    ]
    assert plans[0] is not None and plans[1] is not None and plans[0].grammar == plans[1].grammar
