"""llama.cpp's own grammar and JSON-schema test cases, run against Llamba's grammars.

The cases are data in tests/golden/llama_cpp_cases.json (scripts/make_llama_cpp_goldens.py reads them out
of the C++ test sources of the llama.cpp that llama-cpp-python 0.3.36 vendors):

- test-grammar-integration.cpp: a JSON schema or GBNF grammar with strings it must accept and strings
  it must reject; Llamba compiles it as a request's would be (server/model/llama_schema.py,
  server/model/gbnf.py) and every string must get llama.cpp's verdict (a string is accepted when the
  matcher takes all its tokens and may end there). Its `test_failure_*` grammars must be refused.
- test-json-schema-to-grammar.cpp: each schema compiles, or is refused as llama.cpp refuses it.

A schema is read here as llama.cpp's test reads it (json_schema_to_grammar directly: `{}` is any
value, where a request's empty schema is any object). Strings are fed as SmolLM2's tokens; llguidance
checks bytes, so the tokenizer does not change a verdict, and `token(N)` pieces are token N.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.gguf import GGUFFile
from engine.grammar import CompiledGrammar, GrammarCompiler, GrammarError, GrammarSpec
from engine.text.tokenizer import Tokenizer
from server.model.constraints import schema_spec
from server.model.gbnf import gbnf_spec
from server.model.llama_schema import SchemaError, llama_cpp_schema
from tests.conftest import load_golden
from tests.test_grammar import random_walk

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "grammars and schemas are compiled and matched on text (llguidance): no kernel runs"

GOLDEN = load_golden("llama_cpp_cases")
INTEGRATION = GOLDEN["grammar_integration"]
SCHEMAS = GOLDEN["json_schema_to_grammar"]


@pytest.fixture(scope="module")
def compiler(smollm2_gguf: GGUFFile) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(smollm2_gguf))


def spec_of(kind: str, source: str) -> GrammarSpec:
    """The spec a request's schema or grammar becomes (a schema as llama.cpp's test converts it)."""
    if kind == "schema":
        return schema_spec(json.loads(source), request=False)
    return gbnf_spec(source)


def tokens_of(compiler: GrammarCompiler, text: str | list[Any]) -> list[int]:
    pieces = [text] if isinstance(text, str) else text
    ids: list[int] = []
    for piece in pieces:
        if isinstance(piece, dict):
            ids.append(piece["token"])
        else:
            ids += compiler.tokenizer.encode(piece, add_special=False, parse_special=False)
    return ids


def accepts(compiled: CompiledGrammar, ids: list[int]) -> bool:
    matcher = compiled.matcher()
    return all(matcher.accept(t) for t in ids) and matcher.eos_allowed


def case_id(case: dict[str, Any]) -> str:
    return f"{case['kind']}-line{case['line']}-{case['name'] or 'unnamed'}"


@pytest.mark.parametrize("case", INTEGRATION["cases"], ids=case_id)
def test_every_string_gets_llama_cpps_verdict(case: dict[str, Any], compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(spec_of(case["kind"], case["source"]))
    wrong = [("should accept", s) for s in case["accept"] if not accepts(compiled, tokens_of(compiler, s))]
    wrong += [("should reject", s) for s in case["reject"] if accepts(compiled, tokens_of(compiler, s))]
    assert not wrong, wrong


@pytest.mark.parametrize("case", INTEGRATION["refused"], ids=lambda c: c["name"])
def test_grammars_llama_cpp_refuses_are_refused(case: dict[str, Any], compiler: GrammarCompiler) -> None:
    with pytest.raises(GrammarError, match="invalid GBNF grammar"):
        compiler.compile(gbnf_spec(case["gbnf"]))


@pytest.mark.parametrize("case", SCHEMAS["cases"], ids=lambda c: f"line{c['line']}-{c['name']}")
def test_each_schema_compiles_or_is_refused_as_in_llama_cpp(
    case: dict[str, Any], compiler: GrammarCompiler
) -> None:
    schema = json.loads(case["schema"])
    if case["status"] == "failure":
        with pytest.raises(SchemaError):
            llama_cpp_schema(schema, request=False)
        return
    compiler.compile(spec_of("schema", case["schema"]))
    # llama.cpp's expected grammar is GBNF Llamba reads too
    compiler.compile(gbnf_spec(case["grammar"]))


def test_every_case_in_the_sources_was_extracted() -> None:
    """The extractor read every call it found (a newer llama.cpp with a construct it cannot read shows
    up here, not as silently fewer cases)."""
    assert INTEGRATION["extracted"]["test_schema"] == INTEGRATION["present"]["test_schema"] == 33
    assert INTEGRATION["extracted"]["test_grammar"] == INTEGRATION["present"]["test_grammar"] == 14
    assert SCHEMAS["extracted"] == SCHEMAS["present"] == 81
    assert not INTEGRATION["not_extracted"] and not SCHEMAS["not_extracted"]
    strings = sum(len(c["accept"]) + len(c["reject"]) for c in INTEGRATION["cases"])
    assert strings > 300 and len(INTEGRATION["refused"]) == 7


# -- whitespace and lexemes: Llamba's schema grammar against llama.cpp's own grammar text ------------

SCHEMA_CASES = {c["name"]: c for c in SCHEMAS["cases"] if c["status"] == "success"}
# Where Llamba means to differ (docs/compatibility-json-schema.md): a pattern is matched over the value
# and always written as valid JSON (llama.cpp's "^\"$" writes a bare quote, and an unanchored or `\w`
# pattern is any raw text there), and a property named "" stays a property (llama.cpp's rule for it
# takes over its root rule).
MEANT_TO_DIFFER = {
    "regexp quote",
    "unanchored regexp",
    "regexp with unsupported shorthand",
    "optional props with empty name",
}
# A compact document per schema; whitespace is tried at every boundary of it.
COMPACT = {
    "required + optional props each in original order": '{"b":"y","a":"x","d":"z"}',
    "additional props": '{"k":[1,2.5],"j":[]}',
    "required + optional + additional props": '{"and":1,"also":2,"x":3}',
    "tuple2": '["s",1.5]',
    "empty schema (any value)": '{"a":[1,{"b":null}],"c":true}',
    "anyOf $ref": '{"a":"x","b":true}',
}
WHITESPACE = (" ", "\n  ", "\n\n\t")


def llama_cpp_and_llamba(compiler: GrammarCompiler, name: str) -> tuple[CompiledGrammar, CompiledGrammar]:
    """llama.cpp's expected grammar for the case (GBNF, read as llama.cpp reads it), and Llamba's."""
    case = SCHEMA_CASES[name]
    return compiler.compile(gbnf_spec(case["grammar"])), compiler.compile(spec_of("schema", case["schema"]))


@pytest.mark.parametrize("name", COMPACT)
def test_whitespace_is_allowed_where_llama_cpps_grammar_allows_it(
    name: str, compiler: GrammarCompiler
) -> None:
    """At every boundary of a compact document outside its strings, each kind of whitespace run gets
    the verdict of llama.cpp's grammar for the schema (its `space` after { [ , : and before } ], never
    before a comma or around the document)."""
    theirs, ours = llama_cpp_and_llamba(compiler, name)
    doc = COMPACT[name]
    assert accepts(theirs, tokens_of(compiler, doc)) and accepts(ours, tokens_of(compiler, doc))
    verdicts, quoted = [], False
    for i in range(len(doc) + 1):
        if not quoted:
            for space in WHITESPACE:
                text = doc[:i] + space + doc[i:]
                ids = tokens_of(compiler, text)
                verdicts.append((text, accepts(theirs, ids), accepts(ours, ids)))
        quoted ^= i < len(doc) and doc[i] == '"'
    wrong = [(text, llama_cpp) for text, llama_cpp, llamba in verdicts if llama_cpp != llamba]
    assert not wrong, wrong
    assert any(v[1] for v in verdicts) and not all(v[1] for v in verdicts)  # both verdicts occur


def test_no_whitespace_before_a_comma_or_around_the_document(compiler: GrammarCompiler) -> None:
    _, ours = llama_cpp_and_llamba(compiler, "required + optional props each in original order")
    for text in ('{"b":"y" ,"a":"x"}', '{"b":"y"\n  ,"a":"x"}', ' {"b":"y","a":"x"}', '{"b":"y","a":"x"}\n'):
        assert not accepts(ours, tokens_of(compiler, text)), text
    for text in ('{ "b" : "y", "a": "x" }', '{\n  "b": "y",\n  "a": "x"\n}'):
        assert accepts(ours, tokens_of(compiler, text)), text


@pytest.mark.parametrize(
    ("schema", "accepted", "rejected"),
    [
        # llama.cpp's number: integral part and exponent of at most 16 digits, a fraction of 1-16
        ({"type": "number"}, ["1.1234567890123456", "-1234567890123456e-12"], ["1.12345678901234567"]),
        ({"type": "number"}, ["9999999999999999"], ["12345678901234567", "1e12345678901234567", "1."]),
        # const and enum values as their compact JSON text, nothing else
        ({"enum": [{"a": 1}, [1, 2]]}, ['{"a":1}', "[1,2]"], ['{ "a": 1 }', "[1, 2]", '{"a" :1}']),
        ({"const": "é"}, ['"é"'], ['"\\u00e9"']),
        # llama.cpp's string: no `\/` escape
        ({"type": "string"}, ['"a/b"', '"a\\nb"'], ['"a\\/b"']),
    ],
)
def test_lexemes_are_llama_cpps(
    schema: dict, accepted: list[str], rejected: list[str], compiler: GrammarCompiler
) -> None:
    compiled = compiler.compile(schema_spec(schema, request=False))
    assert all(accepts(compiled, tokens_of(compiler, text)) for text in accepted)
    assert not any(accepts(compiled, tokens_of(compiler, text)) for text in rejected)


@pytest.mark.parametrize("name", sorted(SCHEMA_CASES.keys() - MEANT_TO_DIFFER))
def test_documents_one_grammar_writes_the_other_accepts(name: str, compiler: GrammarCompiler) -> None:
    """A random walk (tokens drawn uniformly among the allowed ones) through llama.cpp's grammar for
    each of its 77 schemas is accepted by Llamba's, and one through Llamba's by llama.cpp's."""
    theirs, ours = llama_cpp_and_llamba(compiler, name)
    for walker, judge in ((theirs, ours), (ours, theirs)):
        text = random_walk(walker, seed=1)
        assert accepts(judge, tokens_of(compiler, text)), text
