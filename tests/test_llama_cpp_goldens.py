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
