"""The Qwen3.5 and Gemma 4 chat formats against llama.cpp 0c1e570: prompts, answers, call grammars.

Prompts: llama.cpp's templates (models/templates/Qwen3.5-4B, google-gemma-4-31B-it and its -interleaved
variant) loaded into a real Llamba server, every body of tests/golden/chat_2026.json posted to
/apply-template, each prompt equal to the real llama-server's (scripts/make_chat_2026_goldens.py): system
and user, past reasoning, tools, past calls and results, a turn ending on a result, thinking on and off,
content parts, no generation prompt, prefills, and test-chat.cpp's own generation-prompt checks.

Answers: llama.cpp's parsing cases for these templates (its tests/test-chat.cpp) run with every other
format's in tests/test_tool_calls.py (tests/golden/llama_cpp_cases.json); here answers that mix what
those cases test one at a time go through the engine's own readers (engine/text/answer.py), whole and
streamed at every chunking, with the deltas a stream sends checked. Grammars: the formats' call grammars
through llguidance, over SmolLM2's vocabulary and Gemma 4's own (its `<|"|>` and `<|tool_call>` tokens).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.api import GenerationRequest, ToolCallSpec
from engine.gguf import GGUFFile
from engine.grammar import GrammarCompiler
from engine.reference_data import ReferenceDataError, reference_file
from engine.text.answer import answer_readers
from engine.text.chat import ChatTemplate
from engine.text.reasoning import resolve_spec
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import FORMATS, ParsedMessage, ToolChoice, detect_format, sequential_ids
from engine.text.tool_calls.gemma4 import fold_tool_responses
from engine.text.tool_calls.syntax import ToolGrammar
from engine.tool_grammar import tool_grammar_spec
from tests.conftest import load_golden, require
from tests.grammar_triggers import grammar_start
from tests.server_process import ServerProcess

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "templates, answer parsers and grammars are Python: no kernel runs"

GOLDEN = load_golden("chat_2026")
QWEN, GEMMA, GEMMA_OLD = "Qwen3.5-4B", "google-gemma-4-31B-it", "google-gemma-4-31B-it-interleaved"


def reference(path: str) -> Path:
    try:
        return reference_file(path)
    except ReferenceDataError as exc:
        require(f"llama.cpp's reference files could not be fetched: {exc}")
        raise  # (not reached: require() does not return when given a reason)


def template_source(name: str) -> str:
    return reference(f"models/templates/{name}.jinja").read_text()


def tool(name: str, properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(required)}
    return {"type": "function", "function": {"name": name, "description": name, "parameters": parameters}}


WEATHER = tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, ("city",))
TODOS = tool(
    "set_todos",
    {
        "todos": {"type": "array", "items": {"type": "object", "properties": {"text": {"type": "string"}}}},
        "note": {"type": ["string", "null"]},
    },
    ("todos",),
)


# -- prompts: llama-server's /apply-template ---------------------------------------------------------------


@pytest.fixture(scope="module", params=tuple(GOLDEN["prompts"]))
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, ServerProcess]]:
    """SmolLM2 (it lends its BOS/EOS texts) under one of the templates, as the goldens were made."""
    path = reference(f"models/templates/{request.param}.jinja")
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "1024", "--chat-template-file", str(path))
    yield request.param, proc.wait_healthy()
    proc.stop()


def golden_bodies(template: str) -> dict[str, dict[str, Any]]:
    checks = GOLDEN["test_chat_generation_prompts"]["bodies"].get(template, [])
    named = {f"test_chat_generation_prompt_{i}": body for i, body in enumerate(checks)}
    return {**GOLDEN["cases"], **named}


def test_prompts_equal_llama_servers(served: tuple[str, ServerProcess]) -> None:
    template, server = served
    expected = GOLDEN["prompts"][template]
    bodies = golden_bodies(template)
    assert set(bodies) == set(expected) and len(bodies) >= 16
    differences = []
    with httpx.Client(base_url=server.base_url, timeout=60) as api:
        for name, body in bodies.items():
            reply = api.post("/apply-template", json=body)
            want = expected[name]
            if reply.status_code != want["status"] or reply.json().get("prompt") != want["prompt"]:
                differences.append((name, reply.status_code, reply.text))
            assert want["prompt"].endswith(want.get("ends_with", ""))  # test-chat.cpp's own check
    assert differences == []


def test_the_prompt_side_is_what_llama_cpp_feeds_the_template(served: tuple[str, ServerProcess]) -> None:
    """What the goldens hold, said plainly: content parts reach both templates as parts (they join them
    without a separator), past call arguments reach Gemma 4 as objects, a turn closed after a tool
    result is followed by the model's turn, and the older Gemma 4 template gets the results folded in."""
    template, _ = served
    prompts = {name: case["prompt"] for name, case in GOLDEN["prompts"][template].items()}
    assert "Hellothere" in prompts["content_parts"]
    if template == QWEN:
        assert prompts["thinking_off"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
        assert "<parameter=days>\n2\n</parameter>" in prompts["tool_call_and_result"]
        return
    turn = prompts["tool_call_and_result"]
    assert 'call:get_weather{city:<|"|>Paris<|"|>,days:2}<tool_call|>' in turn
    assert turn.endswith("<turn|>\n<|turn>model\n")
    if template == GEMMA:  # the result's text as it came
        result = '{value:<|"|>{"temperature": 21, "sky": "clear"}<|"|>}<tool_response|>It is 21 degrees'
    else:  # folded: a JSON result parsed
        result = '{sky:<|"|>clear<|"|>,temperature:21}<tool_response|>It is 21 degrees'
    assert "response:get_weather" + result in turn


def test_the_older_gemma_template_gets_llama_cpps_folded_turns() -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}, "id": "c0"}
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "reasoning_content": "Hmm.", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c0", "content": '{"r": "ok"}'},
        {"role": "tool", "tool_call_id": "c9", "content": "not json"},
        {"role": "assistant", "content": "Done."},
    ]
    folded = fold_tool_responses(messages)
    assert folded == [
        messages[0],
        {
            "role": "assistant",
            "tool_calls": [call],
            "reasoning_content": "Hmm.",
            "tool_responses": [
                {"name": "f", "response": {"r": "ok"}},
                {"name": "c9", "response": "not json"},
            ],
            "content": "Done.",
        },
    ]


def test_formats_are_detected_as_llama_cpp_picks_them() -> None:
    detected = {
        name: detect_format(template_source(name)).name
        for name in (QWEN, "Qwen3-Coder", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", GEMMA, GEMMA_OLD)
    }
    assert detected == {
        QWEN: "Qwen3-Coder (thinking)",
        "Qwen3-Coder": "Qwen3-Coder",
        "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": "Qwen3-Coder (thinking)",
        GEMMA: "Gemma 4",
        GEMMA_OLD: "Gemma 4 (folded tool responses)",
    }
    # Qwen-Qwen3 keeps Hermes' JSON calls; the typed-content probe finds what llama.cpp's finds
    assert detect_format(template_source("Qwen-Qwen3-0.6B")).name == "Hermes 2 Pro"
    assert ChatTemplate(template_source(QWEN), QWEN).caps.supports_typed_content
    assert not ChatTemplate(template_source("LFM2-8B-A1B"), "lfm2").caps.supports_typed_content


# -- answers: the engine's readers, whole and streamed ------------------------------------------------------


def request(
    template: str, tools: list[dict], reasoning_format: str = "auto", **kwargs: Any
) -> GenerationRequest:
    """A chat answer's reading as the server sets it up: the template's prompt (one user turn) decides
    whether the reasoning block is open; the format reads calls when there are tools."""
    source = template_source(template)
    fmt = detect_format(source)
    prompt = ChatTemplate(source, template).render(
        [{"role": "user", "content": "Hi"}], tools=tools or None, with_starts=False, **kwargs
    )
    text = fmt.finish_prompt(source, prompt.text, True)
    spec = resolve_spec(reasoning_format, source, text, own_tags=fmt.reasoning_tags)
    return GenerationRequest(
        [], reasoning=spec, tool_calls=ToolCallSpec(fmt.name, tuple(tools), calls=bool(tools))
    )


def read(req: GenerationRequest, chunks: list[str], stream: bool = True) -> tuple[ParsedMessage, list[Any]]:
    """The message and the deltas, reading the answer in `chunks`."""
    from dataclasses import replace

    assert req.tool_calls is not None
    req = replace(req, tool_calls=replace(req.tool_calls, stream_arguments=stream))
    readers = answer_readers(req, lambda text: [], sequential_ids())
    deltas = [readers.read(chunk) for chunk in chunks] + [readers.read("", final=True)]
    message = ParsedMessage()
    for delta in deltas:
        message.add(delta)
    return message, [d for d in deltas if d]


def chunkings(text: str) -> list[list[str]]:
    rng = random.Random(4)
    sizes = [[rng.randint(1, 9) for _ in text] for _ in range(3)]
    cut = [
        [text[sum(s[:i]) : sum(s[: i + 1])] for i in range(len(text)) if sum(s[:i]) < len(text)]
        for s in sizes
    ]
    return [[text], list(text), *cut]


def assert_reads(
    req: GenerationRequest, output: str, content: str, reasoning: str, calls: list[tuple]
) -> None:
    expected = (content, reasoning, [(name, json.loads(args)) for name, args in calls])
    whole, _ = read(req, [output], stream=False)
    assert (
        whole.content,
        whole.reasoning,
        [(c.name, json.loads(c.arguments)) for c in whole.tool_calls],
    ) == expected
    for chunks in chunkings(output):
        message, deltas = read(req, chunks)
        assert message.tool_calls == whole.tool_calls and (message.content, message.reasoning) == expected[:2]
        # a stream names each call (name and id) in its first delta, then sends its arguments in order
        steps = [step for d in deltas for step in d.tool_calls]
        firsts = [s for s in steps if s.name is not None]
        assert [(s.index, s.name, s.id) for s in firsts] == [
            (i, c.name, c.id) for i, c in enumerate(whole.tool_calls)
        ]


QWEN_ANSWER = (
    "The user wants the weather.\n</think>\n\nLet me check.\n"
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n"
    '<tool_call>\n<function=set_todos>\n<parameter=todos>\n[{"text": "buy milk"}]\n</parameter>\n'
    "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>"
)


def test_qwen35_reasoning_content_and_typed_calls() -> None:
    # llama.cpp types each value by the tool's schema: string text, integer 3, an array, and null for a
    # string-or-null parameter whose text is JSON null
    assert_reads(
        request(QWEN, [WEATHER, TODOS]),
        QWEN_ANSWER,
        "Let me check.\n",
        "The user wants the weather.",
        [
            ("get_weather", '{"city": "San Francisco", "days": 3}'),
            ("set_todos", '{"todos": [{"text": "buy milk"}], "note": null}'),
        ],
    )


def test_qwen35_a_call_ends_the_thinking_and_trailing_text_is_dropped() -> None:
    output = "Need the weather.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
    output += "</function>\n</tool_call>\nAnything after the calls."
    assert_reads(
        request(QWEN, [WEATHER]), output, "", "Need the weather.", [("get_weather", '{"city": "Oslo"}')]
    )


def test_qwen35_reasoning_format_none_keeps_the_prompts_open_block() -> None:
    """llama-server parses the generation prompt with the answer: its `<think>\\n` starts the content."""
    req = request(QWEN, [], reasoning_format="none")
    message, _ = read(req, ["I'm\nthinking\n</think>\n\nHello"])
    assert (message.content, message.reasoning) == ("<think>\nI'm\nthinking\n</think>\n\nHello", "")
    off = request(QWEN, [], reasoning_format="none", enable_thinking=False)
    assert read(off, ["Hello"])[0].content == "Hello"  # the prompt closed its block: nothing open


GEMMA_ANSWER = (
    "<|channel>thought\nThe user wants the weather.<channel|>Checking.<|tool_call>call:get_weather"
    '{city:<|"|>Paris, "FR"<|"|>,days:2}<tool_call|><|tool_call>call:set_todos{todos:[{text:<|"|>buy milk'
    '<|"|>}],note:null,opts:{fast:true,ratio:-1.5e3,tags:[]}}<tool_call|>'
)


GEMMA_OPTS = '{"fast": true, "ratio": -1.5e3, "tags": []}'


def test_gemma4_reasoning_content_and_nested_calls() -> None:
    assert_reads(
        request(GEMMA, [WEATHER, TODOS]),
        GEMMA_ANSWER,
        "Checking.",
        "The user wants the weather.",
        [
            ("get_weather", '{"city": "Paris, \\"FR\\"", "days": 2}'),
            ("set_todos", '{"todos": [{"text": "buy milk"}], "note": null, "opts": ' + GEMMA_OPTS + "}"),
        ],
    )


def test_gemma4_thought_blocks_and_a_lone_channel_end_without_tools() -> None:
    """A later thought block is reasoning too; a lone `<channel|>` ends the content (llama.cpp's parser
    stops there); call markup without tools is content."""
    req = request(GEMMA, [])
    output = "Hi<|channel>thought\nmore<channel|> there <|tool_call>call:f{}<tool_call|><channel|>dropped"
    assert_reads(req, output, "Hi there <|tool_call>call:f{}<tool_call|>", "more", [])
    raw = request(GEMMA, [], reasoning_format="none")
    message, _ = read(raw, ["<|channel>thought\nHmm<channel|>Hi"])
    assert (message.content, message.reasoning) == ("<|channel>thought\nHmm<channel|>Hi", "")


def test_gemma4_a_call_with_broken_arguments_is_content_in_the_final_parse() -> None:
    req = request(GEMMA, [WEATHER])
    output = "Sure.<|tool_call>call:get_weather{city Paris}<tool_call|>"
    whole, _ = read(req, [output], stream=False)
    assert (whole.content, whole.tool_calls) == (output, [])
    unknown = "<|tool_call>call:get_time{}<tool_call|>"
    assert read(req, [unknown], stream=False)[0] == ParsedMessage(unknown, "", [])


def test_a_call_streams_its_string_arguments_as_they_come() -> None:
    """Long string values are not held back until their close (only a suffix that may start it)."""
    for template, opening in ((QWEN, "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan"),
                              (GEMMA, '<|tool_call>call:get_weather{city:<|"|>San')):  # fmt: skip
        req = request(template, [WEATHER], enable_thinking=False)
        _, deltas = read(req, [opening, " Francisco"])
        steps = [step for d in deltas for step in d.tool_calls]
        assert steps[0].name == "get_weather" and "".join(s.arguments for s in steps[:1]).endswith('"San')
        assert steps[1].arguments == " Francisco"


# -- grammars: llguidance over real vocabularies ---------------------------------------------------------


@pytest.fixture(scope="module")
def compilers(smollm2_gguf: GGUFFile) -> dict[str, GrammarCompiler]:
    gemma4 = GGUFFile(reference("models/ggml-vocab-gemma-4.gguf"))
    return {
        "smollm2": GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(smollm2_gguf)),
        "gemma4": GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(gemma4)),
    }


def accepts(compiler: GrammarCompiler, grammar: ToolGrammar, text: str) -> bool:
    matcher = compiler.compile(tool_grammar_spec(grammar, compiler.special_tokens)).matcher()
    tokens = compiler.tokenizer.encode(text, add_special=False, parse_special=True)
    return all(matcher.accept(t) for t in tokens) and matcher.eos_allowed


QWEN_CALLS = QWEN_ANSWER[QWEN_ANSWER.index("<tool_call>") :]
GEMMA_CALLS = GEMMA_ANSWER[GEMMA_ANSWER.index("<|tool_call>") :]
CALLS = {
    "Qwen3-Coder (thinking)": QWEN_CALLS,
    "Qwen3-Coder": QWEN_CALLS.removeprefix("<tool_call>\n"),  # its first call may leave the tag out
    "Gemma 4": GEMMA_CALLS,
}


@pytest.mark.parametrize("vocab", ["smollm2", "gemma4"])
@pytest.mark.parametrize("name", list(CALLS))
def test_call_grammars_follow_tool_choice(
    compilers: dict[str, GrammarCompiler], vocab: str, name: str
) -> None:
    fmt, compiler, calls = FORMATS[name], compilers[vocab], CALLS[name]
    required = fmt.grammar(ToolChoice.resolve("required", [WEATHER, TODOS]), parallel_tool_calls=True)
    assert required is not None and not required.lazy
    assert accepts(compiler, required, calls)
    assert not accepts(compiler, required, calls.replace("get_weather", "get_wether"))
    single = fmt.grammar(ToolChoice.resolve("required", [WEATHER, TODOS]), parallel_tool_calls=False)
    assert single is not None and not accepts(compiler, single, calls)
    end = "<tool_call|>" if name == "Gemma 4" else "</tool_call>"
    assert accepts(compiler, single, calls[: calls.index(end) + len(end)])
    auto = fmt.grammar(ToolChoice.resolve("auto", [WEATHER, TODOS]), parallel_tool_calls=True)
    assert auto is not None and auto.lazy
    answer = "Let me check.\n" + calls
    start = grammar_start(auto, answer)
    assert start == len("Let me check.\n") and accepts(compiler, auto, answer[start:])
    assert fmt.grammar(ToolChoice.resolve("none", [WEATHER]), parallel_tool_calls=True) is None
