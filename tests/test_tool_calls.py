"""Tool-call chat formats: detection and rendering on llama.cpp's real templates, parsing (whole and
streamed at every split point and random chunkings), malformed output, and the grammar descriptions
checked against the same outputs. Templates come from the llama-cpp-python sdist (engine.reference_data).
Canned outputs are llama.cpp's own where its test-chat.cpp has one for the template (its parsing cases
are in tests/golden/llama_cpp_cases.json, and all of them for these formats run here too).
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import pytest

from engine.api import GenerationRequest, ReasoningTags, ToolCallSpec
from engine.gguf import GGUFFile
from engine.grammar import GrammarCompiler
from engine.reference_data import ReferenceDataError, reference_file
from engine.text.answer import answer_decoder, answer_readers, prefill_message
from engine.text.chat import ChatTemplate
from engine.text.reasoning import (
    ReasoningSplitter,
    detect_tags,
    prompt_opens_block,
    resolve_spec,
)
from engine.text.tokenizer import Tokenizer
from engine.text.tool_calls import (
    FORMATS,
    ParsedMessage,
    Prefill,
    ToolCall,
    ToolCallFormat,
    ToolChoice,
    detect_format,
    sequential_ids,
)
from engine.text.tool_calls.generic import SYSTEM_PROMPT
from engine.text.tool_calls.minimax import NS
from engine.text.tool_calls.syntax import ToolGrammar
from engine.tool_grammar import tool_grammar_spec
from tests.conftest import load_golden, require
from tests.grammar_triggers import grammar_start

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "tool-call formats are rendered and parsed as text: no kernel runs"


def tool(name: str, properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    parameters = {"type": "object", "properties": properties, "required": list(required)}
    return {
        "type": "function",
        "function": {"name": name, "description": f"The {name} tool", "parameters": parameters},
    }


WEATHER = tool("get_weather", {"city": {"type": "string"}}, ["city"])
TIME = tool("get_time", {"zone": {"type": "string"}}, ["zone"])
BRAVE = tool("brave_search", {"query": {"type": "string"}}, ["query"])
PYTHON = tool("python", {"code": {"type": "string"}}, ["code"])
TOOLS = [WEATHER, TIME]
PARIS, CET = {"city": "Paris"}, {"zone": "CET"}


def reference_template(name: str) -> str:
    """A template from llama.cpp's models/templates; missing data fails under CI and skips elsewhere."""
    try:
        return reference_file(f"models/templates/{name}.jinja").read_text()
    except ReferenceDataError as e:
        require(f"llama.cpp reference data unavailable: {e}")
        raise  # (not reached: require() does not return when given a reason)


def test_reference_data_names_a_missing_file() -> None:
    reference_template("MiniMax-M3")  # (fetched and verified, or skipped/failed as below)
    with pytest.raises(ReferenceDataError, match="not in llama_cpp_python-0.3.36.tar.gz"):
        reference_file("models/templates/no-such-template.jinja")


def test_missing_reference_data_fails_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable(path: str) -> None:
        raise ReferenceDataError("offline")

    monkeypatch.setattr(f"{__name__}.reference_file", unavailable)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        reference_template("MiniMax-M3")
    monkeypatch.setenv("CI", "false")
    with pytest.raises(pytest.skip.Exception):
        reference_template("MiniMax-M3")


@dataclass(frozen=True)
class Case:
    """A native format on its real template: how a past call renders, and a canned answer in it."""

    id: str
    template: str
    format: str
    rendered_call: str  # what the template writes for the history's first call
    output: str  # a model's raw answer (reasoning included)
    content: str
    calls: tuple[tuple[str, dict[str, Any]], ...]
    reasoning: str = ""
    tools: tuple[dict[str, Any], ...] = (WEATHER, TIME)
    ids: tuple[str, ...] | None = None  # ids the model wrote, when the format carries them
    parallel_history: bool = True  # the template renders two calls in one turn
    grammar_text: str | None = None  # the part of `output` a grammar constrains (default: from the trigger)
    # What a model under the grammar writes, where `output` differs (the grammar fixes the key order of
    # a call object; an end-of-generation marker such as GPT-OSS's <|call|> is a token the grammar
    # leaves to the sampler).
    grammar_output: str | None = None
    ids_final: tuple[str, ...] | None = None  # the final parse's ids, where they differ from the stream's


# llama.cpp's own parsing cases (tests/test-chat.cpp), by template and line.
LLAMA_CHAT = load_golden("llama_cpp_cases")["chat"]
_LLAMA_CASES = {(c["template"], c["line"]): c for c in LLAMA_CHAT["cases"]}


def golden_tool(tool: str | dict[str, Any]) -> dict[str, Any]:
    """A tool of llama.cpp's test (named, or given whole) as an OpenAI tool."""
    spec = LLAMA_CHAT["tools"][tool] if isinstance(tool, str) else tool
    function = {
        "name": spec["name"],
        "description": spec["description"],
        "parameters": json.loads(spec["parameters"]),
    }
    return {"type": "function", "function": function}


def from_llama_cpp(case_id: str, template: str, fmt: str, rendered_call: str, line: int, **more: Any) -> Case:
    """A Case whose output and expected message are llama.cpp's test-chat.cpp case at `line`."""
    case = _LLAMA_CASES[(f"models/templates/{template}.jinja", line)]
    expect = case["expect"]
    calls = tuple((c["name"], json.loads(c["arguments"])) for c in expect["tool_calls"])
    ids = tuple(c["id"] for c in expect["tool_calls"]) if any(c["id"] for c in expect["tool_calls"]) else None
    tools = tuple(golden_tool(t) for t in case.get("tools", ()))
    ids = more.pop("ids", ids)
    return Case(
        case_id, template, fmt, rendered_call, case["input"], expect["content"], calls,
        reasoning=expect["reasoning_content"], tools=tools, ids=ids, **more,
    )  # fmt: skip


R1_WEATHER_CALL = (
    "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜>'
)
R1_CALLS = (
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    '{"city": "Paris"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n'
    '```json\n{"zone": "CET"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'
)
CASES = [
    from_llama_cpp(
        "hermes2pro",
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "Hermes 2 Pro",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        3340,
    ),
    Case(
        "qwen3",
        "Qwen-Qwen3-0.6B",
        "Hermes 2 Pro",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "<think>\nThe user wants the weather.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        "",
        (("get_weather", PARIS),),
        reasoning="The user wants the weather.",
    ),
    from_llama_cpp(
        "qwen2.5",
        "Qwen-Qwen2.5-7B-Instruct",
        "Hermes 2 Pro",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        6107,
    ),
    Case(
        "llama3.1-builtin",
        "meta-llama-Llama-3.1-8B-Instruct",
        "Llama 3.x with builtin tools",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '<|python_tag|>brave_search.call(query="weather in Paris")',
        "",
        (("brave_search", {"query": "weather in Paris"}),),
        tools=(WEATHER, BRAVE),
        parallel_history=False,
    ),
    Case(
        "llama3.2",
        "meta-llama-Llama-3.2-3B-Instruct",
        "Llama 3.x",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        "",
        (("get_weather", PARIS),),
        parallel_history=False,
    ),
    Case(
        "llama3.3",
        "meta-llama-Llama-3.3-70B-Instruct",
        "Llama 3.x with builtin tools",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        '{"type": "function", "name": "get_time", "parameters": {"zone": "CET"}}',
        "",
        (("get_time", CET),),
        parallel_history=False,
    ),
    from_llama_cpp(
        "mistral-nemo",
        "mistralai-Mistral-Nemo-Instruct-2407",
        "Mistral Nemo",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "a1b2c3d4e"}',
        5917,
        # A stream names a call's id in its first delta; Nemo writes the id after the arguments, so a
        # stream's id is Llamba's own (the final parse, as llama.cpp's, takes the model's: ids_final).
        ids=("call_0",),
        ids_final=("123456789",),
    ),
    from_llama_cpp(
        "functionary-v3.2",
        "meetkai-functionary-medium-v3.2",
        "Functionary v3.2",
        '>>>get_weather\n{"city": "Paris"}',
        5952,
    ),
    Case(
        "deepseek-r1-distill-qwen",
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        "DeepSeek R1",
        R1_WEATHER_CALL,
        "The user wants weather and time.\n</think>\n\nI'll check both." + R1_CALLS,
        "I'll check both.",
        (("get_weather", PARIS), ("get_time", CET)),
        reasoning="The user wants weather and time.",
    ),
    from_llama_cpp(
        "deepseek-r1-llama-cpp",
        "llama-cpp-deepseek-r1",
        "DeepSeek R1",
        R1_WEATHER_CALL,
        6029,
    ),
    from_llama_cpp(
        "command-r7b",
        "CohereForAI-c4ai-command-r7b-12-2024-tool_use",
        "Command R7B",
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", '
        '"parameters": {"city": "Paris"}}',
        2837,
    ),
    from_llama_cpp(
        "gpt-oss",
        "openai-gpt-oss-120b",
        "GPT-OSS",
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}<|call|>',
        6494,
        parallel_history=False,
    ),
    from_llama_cpp(
        "minimax-m3",
        "MiniMax-M3",
        "MiniMax-M3",
        f'{NS}<invoke name="get_weather">{NS}<city>Paris{NS}</city>{NS}</invoke>',
        5555,
    ),
]


def history(parallel: bool) -> list[dict[str, Any]]:
    """A conversation with a past tool-call turn (string arguments, as OpenAI clients send them)."""
    calls = [_call("a1b2c3d4e", "get_weather", PARIS)]
    results = [{"role": "tool", "tool_call_id": "a1b2c3d4e", "name": "get_weather", "content": "sunny"}]
    if parallel:
        calls.append(_call("f5g6h7i8j", "get_time", CET))
        results.append({"role": "tool", "tool_call_id": "f5g6h7i8j", "name": "get_time", "content": "14:05"})
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
        {"role": "assistant", "content": "It is sunny."},
        {"role": "user", "content": "Thanks!"},
    ]


def _call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def render(
    fmt: ToolCallFormat, template: ChatTemplate | str, messages: list[dict], tools: Sequence[dict]
) -> str:
    """A prompt as the integration renders it: the format's adjustments around ChatTemplate."""
    if isinstance(template, str):
        template = ChatTemplate(template, "test")
    context = fmt.template_context(tools)
    text = template.render(
        fmt.prepare_messages(messages, tools), tools=list(tools), with_starts=False, **context
    )
    return fmt.finish_prompt(template.source, text.text, add_generation_prompt=True)


# -- (1) detection and rendering on the real templates ----------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_real_template_is_detected_and_renders_past_calls(case: Case) -> None:
    source = reference_template(case.template)
    fmt = detect_format(source)
    assert fmt.name == case.format
    prompt = render(fmt, source, history(case.parallel_history), case.tools)
    assert case.rendered_call in prompt
    assert "sunny" in prompt and "It is sunny." in prompt
    assert '\\"city\\"' not in prompt  # arguments reach the template as it wants them, never encoded twice
    if case.parallel_history:
        assert "get_time" in prompt and "14:05" in prompt


def test_templates_without_object_support_get_the_clients_string() -> None:
    template = ChatTemplate(reference_template("meetkai-functionary-medium-v3.2"), "functionary")
    assert template.caps.supports_tool_calls and not template.caps.requires_object_arguments
    prompt = template.render(history(False), tools=TOOLS).text
    assert '>>>get_weather\n{"city": "Paris"}' in prompt


def test_templates_that_need_objects_get_parsed_arguments() -> None:
    template = ChatTemplate(reference_template("MiniMax-M3"), "minimax")
    assert template.caps.requires_object_arguments
    # Its template iterates the arguments' items: a string would fail to render.
    assert f"{NS}<city>Paris{NS}</city>" in template.render(history(True), tools=TOOLS).text


def test_r1_prompt_fixes_apply_to_the_template_revision_llama_cpp_fixes() -> None:
    fmt = FORMATS["DeepSeek R1"]
    old_revision = "{% if ns.is_tool %}{{'<｜tool▁outputs▁end｜>'}}{% endif %}"
    ended = fmt.finish_prompt(old_revision, "x<｜tool▁outputs▁end｜>", add_generation_prompt=True)
    assert ended == "x<｜tool▁outputs▁end｜><｜end▁of▁sentence｜><｜Assistant｜>"
    unclosed = "<｜tool▁call▁end｜>\n<｜User｜>hi"
    closed = "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜User｜>hi"
    assert fmt.finish_prompt(old_revision, unclosed, add_generation_prompt=False) == closed
    # The sdist's revision writes `{%- if ns.is_tool -%}`: llama.cpp's check misses it, and so does ours.
    current = reference_template("deepseek-ai-DeepSeek-R1-Distill-Llama-8B")
    assert detect_format(current).name == "DeepSeek R1"
    assert fmt.finish_prompt(current, "x<｜tool▁outputs▁end｜>", True) == "x<｜tool▁outputs▁end｜>"


def test_llama3_gets_its_date_and_builtin_tools() -> None:
    source = reference_template("meta-llama-Llama-3.1-8B-Instruct")
    fmt = detect_format(source)
    context = fmt.template_context([WEATHER, BRAVE, PYTHON])
    assert (
        context["builtin_tools"] == ["brave_search", "python"] and context["tools_in_user_message"] is False
    )
    prompt = render(fmt, source, history(False), [WEATHER, BRAVE])
    assert "Tools: brave_search" in prompt and "Environment: ipython" in prompt
    assert fmt.extra_stops == ("<|eom_id|>",)


def test_command_r7b_shows_past_reasoning_as_its_tool_plan() -> None:
    source = reference_template("CohereForAI-c4ai-command-r7b-12-2024-tool_use")
    fmt = detect_format(source)
    messages = history(False)
    messages[2] = {**messages[2], "reasoning_content": "I will look it up."}
    assert fmt.prepare_messages(messages, TOOLS)[2]["tool_plan"] == "I will look it up."
    assert "reasoning_content" not in fmt.prepare_messages(messages, TOOLS)[2]
    render(fmt, source, messages, TOOLS)  # (this revision of the template does not show tool_plan)
    assert fmt.finish_prompt(source, "x<|CHATBOT_TOKEN|>", True, enable_thinking=False).endswith(
        "<|START_THINKING|><|END_THINKING|>"
    )


# -- (2) parsing: whole, streamed at every split point, random chunkings -----------------------------


def reasoning_tags(fmt: ToolCallFormat, source: str) -> ReasoningTags | None:
    return fmt.reasoning_tags or detect_tags(source)


def run_stream(
    fmt: ToolCallFormat,
    chunks: Sequence[str],
    tags: ReasoningTags | None,
    starts_open: bool,
    tools: Sequence[dict],
    stream_arguments: bool = True,
) -> ParsedMessage:
    """The integration's pipeline: the reasoning splitter first, the format's parser on the answer."""
    splitter = ReasoningSplitter(tags, starts_open) if tags else None
    parser = fmt.parser(tools, sequential_ids(), stream_arguments)
    message = ParsedMessage()
    for chunk in [*chunks, None]:
        split = (splitter.push(chunk) if chunk is not None else splitter.flush()) if splitter else None
        answer = split.content if split else (chunk or "")
        message.reasoning += split.reasoning if split else ""
        message.add(parser.push(answer))
    return message.add(parser.flush())


def chunkings(text: str, seeds: int = 12) -> list[list[str]]:
    """Every split into two, single characters, and random chunk sizes."""
    result = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    for seed in range(seeds):
        rng, chunks, i = random.Random(seed), [], 0
        while i < len(text):
            n = rng.randint(1, 8)
            chunks.append(text[i : i + n])
            i += n
        result.append(chunks)
    return result


def expected_message(case: Case, final: bool = False) -> ParsedMessage:
    ids = (
        (case.ids_final if final else None) or case.ids or tuple(f"call_{i}" for i in range(len(case.calls)))
    )
    calls = [
        ToolCall(i, name, json.dumps(args, separators=(",", ":")))
        for i, (name, args) in zip(ids, case.calls, strict=True)
    ]
    return ParsedMessage(case.content, case.reasoning, calls)


def pipeline(case: Case) -> tuple[ToolCallFormat, ReasoningTags | None, bool]:
    """The case's format, its reasoning tags, and whether its generation prompt opens the block."""
    source = reference_template(case.template)
    fmt = detect_format(source)
    tags = reasoning_tags(fmt, source)
    prompt = render(fmt, source, [{"role": "user", "content": "Weather in Paris?"}], case.tools)
    return fmt, tags, tags is not None and prompt_opens_block(prompt, tags)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_canned_output_parses_whole_and_streamed(case: Case) -> None:
    fmt, tags, starts_open = pipeline(case)
    whole = run_stream(fmt, [case.output], tags, starts_open, case.tools)
    assert whole == expected_message(case)
    for chunks in chunkings(case.output):
        assert run_stream(fmt, chunks, tags, starts_open, case.tools) == whole, chunks


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_stream_deltas_come_in_llama_servers_order(case: Case) -> None:
    """Per call: index, then id and name once, then argument fragments; content never holds a marker."""
    fmt, tags, starts_open = pipeline(case)
    splitter = ReasoningSplitter(tags, starts_open) if tags else None
    parser = fmt.parser(case.tools, sequential_ids())
    seen: dict[int, str] = {}
    for char in [*case.output, None]:
        answer = char or ""
        if splitter:
            answer = (splitter.push(char) if char is not None else splitter.flush()).content
        delta = parser.push(answer) if char is not None else parser.flush()
        for step in delta.tool_calls:
            first = step.index not in seen
            assert step.index == (len(seen) if first else max(seen))
            assert (
                (step.id is not None and step.name is not None)
                if first
                else (step.id is None and step.name is None)
            )
            seen[step.index] = seen.get(step.index, "") + step.arguments
    assert [json.loads(a) for a in seen.values()] == [args for _, args in case.calls]


def test_parse_equals_the_stream_and_ids_are_generated() -> None:
    fmt = FORMATS["Hermes 2 Pro"]
    content, calls = fmt.parse(
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
    )
    assert content == "" and calls[0].name == "get_weather" and calls[0].arguments == '{"city":"Paris"}'
    assert len(calls[0].id) == 32 and calls[0].id.isalnum()
    mistral_id = FORMATS["Mistral Nemo"].parse('[TOOL_CALLS][{"name": "f", "arguments": {}}]')[1][0].id
    assert len(mistral_id) == 9 and mistral_id.isalnum()


def test_content_is_held_only_while_it_may_be_a_marker() -> None:
    parser = FORMATS["Hermes 2 Pro"].parser((), sequential_ids())
    assert parser.push("Hello <tool").content == "Hello "
    assert parser.push("box>").content == "<toolbox>"
    assert parser.push("<tool_call>").content == ""
    assert parser.flush().content == "<tool_call>"  # a marker with nothing after it stays content


def test_string_arguments_are_taken_as_they_are() -> None:
    _, calls = FORMATS["Hermes 2 Pro"].parse(
        '<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>'
    )
    assert calls[0].arguments == '{"a": 1}'


def test_arguments_are_compact_json_like_llama_servers() -> None:
    arguments = '{"b": [1, 2.50, -0, 1E2], "u": "\\u00e9\\ud83d\\ude00\\n", "n": null}'
    text = '<tool_call>{"name": "f", "arguments": ' + arguments + "}</tool_call>"
    _, calls = FORMATS["Hermes 2 Pro"].parse(text)
    assert calls[0].arguments == '{"b":[1,2.5,0,100.0],"u":"é😀\\n","n":null}'


def test_a_call_cut_short_keeps_what_was_streamed() -> None:
    """Output cut at max_tokens: like llama-server's partial parse, the call keeps its arguments so far."""
    content, calls = FORMATS["Hermes 2 Pro"].parse(
        'Hi <tool_call>{"name": "f", "arguments": {"a": "xy', (), sequential_ids()
    )
    assert content == "Hi " and calls == [ToolCall("call_0", "f", '{"a":"xy')]


def test_generic_format_answers() -> None:
    fmt = FORMATS["Generic"]
    assert fmt.parse('{"response": "It is \\"sunny\\"."}') == ('It is "sunny".', [])
    assert fmt.parse('{"response": {"a": 1}}')[0] == '{\n  "a": 1\n}'
    _, calls = fmt.parse(
        '{"tool_call": {"arguments": {"city": "Paris"}, "name": "get_weather"}}', (), sequential_ids()
    )
    assert calls == [ToolCall("call_0", "get_weather", '{"city":"Paris"}')]
    parallel = (
        '{"tool_calls": [{"id": "abcd", "name": "a", "arguments": {}}, '
        '{"name": "b", "arguments": {"x": 1}, "id": "efgh"}]}'
    )
    _, calls = fmt.parse(parallel, (), sequential_ids())
    assert calls == [ToolCall("abcd", "a", "{}"), ToolCall("call_0", "b", '{"x":1}')]
    assert fmt.parse("Just text.") == ("Just text.", [])


# -- (3) the generic format on SmolLM2's and Gemma 3's templates ---------------------------------------


GENERIC_OUTPUTS = [
    ('{"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}', "", [("get_weather", PARIS)]),
    (
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "c001"}, '
        '{"name": "get_time", "arguments": {"zone": "CET"}, "id": "c002"}]}',
        "",
        [("get_weather", PARIS), ("get_time", CET)],
    ),
    ('{"response": "It is sunny in Paris."}', "It is sunny in Paris.", []),
]


@pytest.fixture(scope="module", params=["smollm2", "gemma3"])
def generic_template(request: pytest.FixtureRequest) -> ChatTemplate:
    gguf: GGUFFile = request.getfixturevalue(f"{request.param}_gguf")
    return ChatTemplate.from_gguf_metadata(gguf.metadata)


def test_generic_templates_are_detected_and_render_tools_as_llama_cpp_does(
    generic_template: ChatTemplate,
) -> None:
    fmt = detect_format(generic_template.source)
    assert fmt.name == "Generic"
    assert not generic_template.caps.supports_tools and not generic_template.caps.supports_tool_calls
    prompt = render(fmt, generic_template, history(True), TOOLS)
    tools_text = "You can call any of the following tools to satisfy the user's requests: " + json.dumps(
        TOOLS, indent=2
    )
    assert "You are a helpful assistant.\n\n" + SYSTEM_PROMPT + "\n\n" + tools_text in prompt
    assert 'Example tool call syntax:\n\n{\n  "tool_calls": [\n    {\n      "name": "tool_name"' in prompt
    past_calls = json.dumps(
        {
            "tool_calls": [
                {"name": "get_weather", "arguments": PARIS, "id": "a1b2c3d4e"},
                {"name": "get_time", "arguments": CET, "id": "f5g6h7i8j"},
            ]
        },
        indent=2,
    )
    assert past_calls in prompt
    result = {"tool_response": {"tool": "get_weather", "content": "sunny", "tool_call_id": "a1b2c3d4e"}}
    assert json.dumps(result, indent=2) in prompt


def test_smollm2_generic_prompt_is_exact(smollm2_gguf: GGUFFile) -> None:
    template = ChatTemplate.from_gguf_metadata(smollm2_gguf.metadata)
    fmt = detect_format(template.source)
    messages = [{"role": "user", "content": "Hi"}]
    call = {"name": "tool_name", "arguments": {"arg1": "some_value"}, "id": "call_1___"}
    example = json.dumps({"tool_calls": [call]}, indent=2)
    system = (
        SYSTEM_PROMPT
        + "\n\nYou can call any of the following tools to satisfy the user's requests: "
        + json.dumps([WEATHER], indent=2)
        + "\n\nExample tool call syntax:\n\n"
        + example
        + "\n\n"
    )
    expected = (
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(fmt, template, messages, [WEATHER]) == expected


@pytest.mark.parametrize(
    ("output", "content", "calls"), GENERIC_OUTPUTS, ids=["tool_call", "tool_calls", "response"]
)
def test_generic_outputs_parse_whole_and_streamed(output: str, content: str, calls: list) -> None:
    fmt = FORMATS["Generic"]
    message = run_stream(fmt, [output], None, False, TOOLS)
    # The model's ids come after the names: the calls already have generated ones.
    expected = [
        ToolCall(f"call_{i}", n, json.dumps(a, separators=(",", ":"))) for i, (n, a) in enumerate(calls)
    ]
    assert message == ParsedMessage(content, "", expected)
    for chunks in chunkings(output):
        assert run_stream(fmt, chunks, None, False, TOOLS) == message


# -- malformed output degrades to content ---------------------------------------------------------------

# Broken before the call is announced: content in both modes.
MALFORMED = [
    ("Generic", '{"tool_call": {"name": }'),
    ("Generic", '{"tool_call": {"arguments": {}}}'),
    ("Hermes 2 Pro", 'Sure. <tool_call>{"name": get_weather}</tool_call> ok'),
    ("Hermes 2 Pro", 'Sure. <tool_call>{"arguments": {}, "name": "f"}</tool_call>'),
    ("Hermes 2 Pro", "Sure. <tool_call>not json at all"),
    ("Llama 3.x", '{"name": oops}'),
    ("Llama 3.x", '{"answer": 42} is my reply'),
    ("Llama 3.x with builtin tools", "<|python_tag|>brave_search(query)"),
    ("Mistral Nemo", "Here:[TOOL_CALLS]not a list"),
    ("Mistral Nemo", '[TOOL_CALLS][{"name": 7, "arguments": {}}]'),
    ("Functionary v3.2", "all\nHi>>>get_weather\noops"),
    ("DeepSeek R1", "Calling.<｜tool▁calls▁begin｜>garbage"),
    ("Command R7B", '<|START_ACTION|>[{"tool_name": ]<|END_ACTION|>'),
    ("GPT-OSS", "<|start|>assistant<|channel|>commentary to=functions.f<|message|>bad"),
    ("GPT-OSS", "plain text, no channel"),
    ("MiniMax-M3", f"Trying.{NS}<tool_call>garbage{NS}</tool_call>"),
]
# Broken after the call is announced (its JSON had begun): content for the final parse only.
MALFORMED_LATE = [
    ("Hermes 2 Pro", 'Sure. <tool_call>{"name": "f", "arguments": {"a": tru}}</tool_call>'),
    ("Functionary v3.2", "all\nHi>>>get_weather\n{oops}"),
    ("DeepSeek R1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n[oops"),
    ("GPT-OSS", "<|start|>assistant<|channel|>commentary to=functions.f<|message|>{bad"),
    ("Generic", '{"tool_call": {"name": "f", "arguments": {"a": 1}}, "response": broken}'),
]


def as_content(output: str) -> str:
    return output[len("all\n") :] if output.startswith("all\n") else output  # Functionary's header goes


@pytest.mark.parametrize("stream_arguments", [True, False], ids=["streaming", "final"])
@pytest.mark.parametrize(("name", "output"), MALFORMED)
def test_a_marker_with_broken_json_stays_content(name: str, output: str, stream_arguments: bool) -> None:
    fmt = FORMATS[name]
    expected = as_content(output)
    assert fmt.parse(output, stream_arguments=stream_arguments) == (expected, [])
    for chunks in chunkings(output, seeds=4):
        assert run_stream(fmt, chunks, None, False, TOOLS, stream_arguments) == ParsedMessage(expected)


@pytest.mark.parametrize("stream_arguments", [True, False], ids=["streaming", "final"])
def test_a_marker_without_a_call_after_it_is_content_and_parsing_goes_on(stream_arguments: bool) -> None:
    call = '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    text = "Wrap calls in <tool_call> tags. " + call
    message = run_stream(FORMATS["Hermes 2 Pro"], [text], None, False, TOOLS, stream_arguments)
    assert message == ParsedMessage(
        "Wrap calls in <tool_call> tags. ", "", [ToolCall("call_0", "get_time", '{"zone":"CET"}')]
    )
    text = 'all\nIn Python: >>> print(1)\n>>>get_time\n{"zone": "CET"}'
    for chunks in chunkings(text, seeds=4):
        message = run_stream(FORMATS["Functionary v3.2"], chunks, None, False, TOOLS, stream_arguments)
        assert message == ParsedMessage(
            "In Python: >>> print(1)\n", "", [ToolCall("call_0", "get_time", '{"zone":"CET"}')]
        )


@pytest.mark.parametrize(("name", "output"), MALFORMED_LATE)
def test_a_call_broken_after_it_began_is_content_in_the_final_parse(name: str, output: str) -> None:
    fmt = FORMATS[name]
    assert fmt.parse(output, stream_arguments=False) == (output, [])
    for chunks in chunkings(output, seeds=4):
        assert run_stream(fmt, chunks, None, False, TOOLS, False) == ParsedMessage(output)


def test_a_call_broken_after_it_began_keeps_its_streamed_part() -> None:
    """A streamed call cannot be taken back: it keeps what was sent, the rest of the text is content."""
    content, calls = FORMATS["GPT-OSS"].parse(MALFORMED_LATE[3][1], (), sequential_ids())
    assert (content, calls) == ("bad", [ToolCall("call_0", "f", "{")])
    content, calls = FORMATS["Hermes 2 Pro"].parse(MALFORMED_LATE[0][1], (), sequential_ids())
    assert content == "Sure. }}</tool_call>" and calls == [ToolCall("call_0", "f", '{"a":')]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_final_parse_gives_the_same_calls_whole_at_the_flush(case: Case) -> None:
    fmt, tags, starts_open = pipeline(case)
    parser = fmt.parser(case.tools, sequential_ids(), stream_arguments=False)
    splitter = ReasoningSplitter(tags, starts_open) if tags else None
    message = ParsedMessage()
    for char in case.output:
        delta = parser.push(splitter.push(char).content if splitter else char)
        assert not delta.tool_calls
        message.add(delta)
    tail = splitter.flush().content if splitter else ""
    message.add(parser.push(tail)).add(parser.flush())
    expected = expected_message(case, final=True)
    assert (message.content, message.tool_calls) == (expected.content, expected.tool_calls)


# -- llama.cpp's own parsing cases (test-chat.cpp's PEG-parser tests, every one for these formats) ---------


@functools.cache
def llama_case_request(template: str, line: int) -> tuple[GenerationRequest, list[dict]]:
    """A case as Llamba's chat pipeline would run it: the engine request's answer reading (the
    format's parser, calls only with tools, the reasoning split its request asks for, resolved against
    the rendered prompt, the ```json fence rule under a schema) and the prefill the prompt continues
    (llama.cpp's continue_final_message), once per case; and the case's tools."""
    case = _LLAMA_CASES[(template, line)]
    source = reference_template(template.removeprefix("models/templates/").removesuffix(".jinja"))
    fmt = detect_format(source)
    assert fmt.name == case["format"]
    tools = [golden_tool(t) for t in case.get("tools", ())]
    messages = case.get("messages") or [{"role": "user", "content": "Hey there!"}]
    context = {**fmt.template_context(tools), "enable_thinking": case.get("enable_thinking", True)}
    template_ = ChatTemplate(source, "test")
    part = case.get("continue_final_message", "")  # llama.cpp's test names the part continued
    asked = {"content": "content", "reasoning": "reasoning_content"}.get(part)
    tags = fmt.reasoning_tags or detect_tags(source)
    rendered = template_.render(
        fmt.prepare_messages(messages, tools),
        add_generation_prompt=case.get("add_generation_prompt", True),
        tools=tools,
        with_starts=False,
        continue_final_message=asked or False,
        continuation=lambda prompt, gen, prefill: fmt.continue_prompt(prompt, gen, prefill, tags),
        **context,
    )
    text = rendered.text
    if not rendered.prefill_text:
        text = fmt.finish_prompt(source, text, add_generation_prompt=True)
    before = text[: len(text) - len(rendered.prefill_text)]
    spec = resolve_spec(case.get("reasoning_format", "none"), source, before, own_tags=fmt.reasoning_tags)
    calls = bool(tools) and case.get("tool_choice", "auto") != "none"
    parsing = ToolCallSpec(fmt.name, tuple(tools), True, calls=calls, fenced_json="json_schema" in case)
    return GenerationRequest([], reasoning=spec, tool_calls=parsing, prefill=rendered.prefill_text), tools


def parse_llama_case(case: dict[str, Any], chunks: Sequence[str], stream_arguments: bool) -> ParsedMessage:
    """llama.cpp's case through Llamba's engine readers (engine/text/answer.py), as a chat reply
    reports it: the prefilled message the answer continues, then the answer read chunk by chunk."""
    request, _ = llama_case_request(case["template"], case["line"])
    request = replace(request, tool_calls=replace(request.tool_calls, stream_arguments=stream_arguments))
    prefix = prefill_message(request)
    message = ParsedMessage(prefix.content, prefix.reasoning)
    readers = answer_readers(request, lambda text: [], sequential_ids())
    for chunk in chunks:
        message.add(readers.read(chunk))
    message.add(readers.read("", final=True))
    return message


def llama_difference(case: dict[str, Any], got: ParsedMessage, check_ids: bool = True) -> str | None:
    """llama.cpp's comparison (assert_msg_equals): content and reasoning up to surrounding whitespace,
    each call's name, its arguments as JSON (text that is no JSON yet counts as empty) and its id where
    llama.cpp expects one (Llamba names every call; llama-server adds ids after its parser)."""
    expect = case["expect"]

    def json_text(arguments: str) -> str:
        try:
            return json.dumps(json.loads(arguments), sort_keys=True)
        except json.JSONDecodeError:
            return ""

    if (got.content.strip(), got.reasoning.strip()) != (
        expect["content"].strip(),
        expect["reasoning_content"].strip(),
    ):
        return f"content/reasoning {got.content!r} / {got.reasoning!r}"
    if len(got.tool_calls) != len(expect["tool_calls"]):
        return f"calls {got.tool_calls}"
    for want, call in zip(expect["tool_calls"], got.tool_calls, strict=True):
        if want["name"] != call.name or json_text(want["arguments"]) != json_text(call.arguments):
            return f"call {call}"
        if check_ids and want["id"] and want["id"] != call.id:
            return f"call id {call.id!r}"
    return None


def llama_case_id(case: dict[str, Any]) -> str:
    return f"{case['template'][17:-6]}-line{case['line']}"


@pytest.mark.parametrize("case", LLAMA_CHAT["cases"], ids=llama_case_id)
def test_llama_cpps_parsing_cases_parse_to_its_messages_whole_and_streamed(case: dict[str, Any]) -> None:
    """Whole (a non-streamed reply's final parse) and streamed character by character (every chunk
    boundary) and in random chunks, each must give llama.cpp's expected message."""
    # llama.cpp's partial parse (an unfinished output) is what a stream shows; a whole reply is final
    whole = parse_llama_case(case, [case["input"]], stream_arguments=bool(case.get("is_partial")))
    assert llama_difference(case, whole) is None, llama_difference(case, whole)
    # A stream announces a call's id with its name: an id written after the arguments (Mistral Nemo)
    # names the call in the final parse only.
    late_id = case["format"] == "Mistral Nemo"
    for chunks in [[case["input"]], list(case["input"]), *chunkings(case["input"], seeds=2)[-2:]]:
        streamed = parse_llama_case(case, chunks, stream_arguments=True)
        assert llama_difference(case, streamed, check_ids=not late_id) is None, (chunks, streamed)


def test_the_chat_cases_cover_every_implemented_format() -> None:
    formats = {case["format"] for case in LLAMA_CHAT["cases"]}
    # llama.cpp's test has no generic case now, nor one for the older Gemma 4 template (its parser is
    # the newer one's; tests/test_chat_qwen35_gemma4.py renders its prompts)
    assert formats == {f for f in FORMATS if f not in ("Generic", "Gemma 4 (folded tool responses)")}
    assert LLAMA_CHAT["extracted"] == LLAMA_CHAT["present"]["implemented_formats"] == 177
    assert len(LLAMA_CHAT["cases"]) == 177  # every one parses as llama.cpp's (no case set aside)


# -- tool choice and the grammar descriptions ------------------------------------------------------------


def test_tool_choice_resolution() -> None:
    assert ToolChoice.resolve(None, TOOLS) == ToolChoice("auto", tuple(TOOLS))
    assert ToolChoice.resolve("required", TOOLS).mode == "required"
    assert ToolChoice.resolve("auto", []).mode == "none"
    named = ToolChoice.resolve({"type": "function", "function": {"name": "get_time"}}, TOOLS)
    assert named == ToolChoice("required", (TIME,))
    with pytest.raises(ValueError, match="not among the tools"):
        ToolChoice.resolve({"type": "function", "function": {"name": "nope"}}, TOOLS)
    with pytest.raises(ValueError, match="tool_choice must be"):
        ToolChoice.resolve("sometimes", TOOLS)


@pytest.fixture(scope="module")
def grammars(smollm2_gguf: GGUFFile) -> GrammarCompiler:
    """The grammar engine (llguidance) over SmolLM2's vocabulary: the formats' markers are plain text
    there, so a grammar checks exactly the characters the format describes."""
    return GrammarCompiler.for_tokenizer(Tokenizer.from_gguf(smollm2_gguf))


def accepts(grammars: GrammarCompiler, grammar: ToolGrammar, text: str) -> bool:
    """Whether the real grammar engine takes `text` whole (a lazy grammar from its trigger on)."""
    matcher = grammars.compile(tool_grammar_spec(grammar, grammars.special_tokens)).matcher()
    tokens = grammars.tokenizer.encode(text, add_special=False, parse_special=False)
    return all(matcher.accept(t) for t in tokens) and matcher.eos_allowed


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_the_grammar_accepts_the_canned_calls_from_its_trigger(case: Case, grammars: GrammarCompiler) -> None:
    fmt = FORMATS[case.format]
    grammar = fmt.grammar(ToolChoice.resolve("auto", case.tools), parallel_tool_calls=True)
    assert grammar is not None and grammar.lazy and grammar.triggers
    answer = answer_text(fmt, case, case.grammar_output)
    assert accepts(grammars, grammar, answer), "the lazy grammar, fed the whole answer"
    start = grammar_start(grammar, answer)
    assert start is not None, "no trigger fires on the canned output"
    constrained = case.grammar_text if case.grammar_text is not None else answer[start:]
    assert answer[start:].startswith(constrained)
    required = fmt.grammar(ToolChoice.resolve("required", case.tools), parallel_tool_calls=True)
    assert required is not None and not required.lazy and accepts(grammars, required, constrained)
    first_name = case.calls[0][0]
    assert not accepts(grammars, required, constrained.replace(first_name, first_name + "x", 1))
    assert fmt.grammar(ToolChoice.resolve("none", case.tools), parallel_tool_calls=True) is None


def answer_text(fmt: ToolCallFormat, case: Case, output: str | None = None) -> str:
    """The output with its leading reasoning block removed (the grammar sees it, but it cannot trigger)."""
    tags = fmt.reasoning_tags or ReasoningTags()
    output = output or case.output
    for end in tags.ends:
        if case.reasoning and end in output:
            output = output.split(end, 1)[1].lstrip()
    return output


def test_grammar_follows_tool_choice_and_parallel_calls(grammars: GrammarCompiler) -> None:
    fmt = FORMATS["Hermes 2 Pro"]
    one = '<tool_call>{"name": "get_time", "arguments": {"zone": "CET"}}</tool_call>'
    named = fmt.grammar(
        ToolChoice.resolve({"type": "function", "function": {"name": "get_time"}}, TOOLS), False
    )
    assert named is not None and not named.lazy
    assert accepts(grammars, named, one)
    assert not accepts(grammars, named, one.replace("get_time", "get_weather"))
    assert not accepts(grammars, named, one + "\n" + one)
    parallel = fmt.grammar(ToolChoice.resolve("auto", TOOLS), True)
    assert parallel is not None and accepts(grammars, parallel, one + "\n" + one)


@pytest.mark.parametrize(
    ("output", "content", "calls"), GENERIC_OUTPUTS, ids=["tool_call", "tool_calls", "response"]
)
def test_the_generic_grammar_is_the_whole_answer(
    output: str, content: str, calls: list, grammars: GrammarCompiler
) -> None:
    parallel = output.startswith('{"tool_calls"')
    grammar = FORMATS["Generic"].grammar(ToolChoice.resolve("auto", TOOLS), parallel)
    assert grammar is not None and not grammar.lazy and accepts(grammars, grammar, output)
    required = FORMATS["Generic"].grammar(ToolChoice.resolve("required", TOOLS), parallel)
    assert required is not None and accepts(grammars, required, output) == bool(calls)


# -- continue_final_message (assistant prefill) ----------------------------------------------------------


def test_continue_final_message_on_smollm2(smollm2_gguf: GGUFFile) -> None:
    template = ChatTemplate.from_gguf_metadata(smollm2_gguf.metadata)
    messages = [{"role": "user", "content": "Count to three."}, {"role": "assistant", "content": "One, two,"}]
    head = template.render(messages[:1]).text
    continued = template.render(messages, continue_final_message=True)
    assert continued.text == head + "One, two,"
    assert continued.text.endswith("<|im_start|>assistant\nOne, two,")
    assert continued.message_starts[-1] == len(head) - len("<|im_start|>assistant\n")
    assert (
        template.render(messages, continue_final_message=None).text == continued.text
    )  # auto: last is assistant
    assert template.render(messages).text.endswith("One, two,<|im_end|>\n<|im_start|>assistant\n")


def test_continue_final_message_refusals() -> None:
    template = ChatTemplate.builtin("chatml")
    user = {"role": "user", "content": "x"}
    with pytest.raises(ValueError, match="last message to be the assistant's"):
        template.render([user], continue_final_message=True)
    calling = {"role": "assistant", "content": None, "tool_calls": [_call("c1", "f", {})]}
    with pytest.raises(ValueError, match="contains tool calls"):
        template.render([user, calling], continue_final_message=True)
    two = [user, {"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(ValueError, match="2 or more assistant messages"):
        template.render(two, continue_final_message=None)


def test_a_prefill_is_resolved_as_llama_cpp_resolves_it() -> None:
    """continue_final_message true (or the heuristic) continues the reasoning while the message has
    reasoning and no content; "content" / "reasoning_content" name the part."""
    thinking = {"role": "assistant", "content": "", "reasoning_content": "I'm"}
    both = {"role": "assistant", "content": "Hello, ", "reasoning_content": "I'm thinking"}
    assert Prefill.of(thinking, True) == Prefill("I'm", "", "reasoning")
    assert Prefill.of(thinking, None) == Prefill("I'm", "", "reasoning")
    assert Prefill.of(thinking, "content") == Prefill("I'm", "", "content")
    assert Prefill.of(both, True) == Prefill("I'm thinking", "Hello, ", "content")
    assert Prefill.of(both, "reasoning_content").mode == "reasoning"
    template = ChatTemplate.builtin("chatml")
    parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "content": parts}]
    rendered = template.render(messages, continue_final_message=None)
    assert rendered.text.endswith("<|im_start|>assistant\nWh\n\nill") and rendered.prefill_text == "Wh\n\nill"


# -- an answer without tools, and one under a schema -----------------------------------------------------


def read_answer(chunks: Sequence[str], spec: ToolCallSpec) -> ParsedMessage:
    """An answer (without reasoning handling) through the engine's readers, chunk by chunk."""
    readers = answer_readers(GenerationRequest([], tool_calls=spec), lambda t: [], sequential_ids())
    message = ParsedMessage()
    for chunk in chunks:
        message.add(readers.read(chunk))
    return message.add(readers.read("", final=True))


NO_TOOLS = [
    # (format, answer, content): llama-server's parser for a request without tools reads the format's
    # markup and leaves call markup as content (a GPT-OSS call to a tool nobody offered is dropped).
    (
        "Hermes 2 Pro",
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}</tool_call>',
    ),
    ("Functionary v3.2", "all\nHello there", "Hello there"),
    ("Functionary v3.2", 'f\n{"a": 1}', 'f\n{"a": 1}'),
    ("GPT-OSS", "<|channel|>final<|message|>Hi", "Hi"),
    ("GPT-OSS", '<|channel|>commentary to=functions.f <|constrain|>json<|message|>{"a": 1}<|call|>', ""),
    ("Command R7B", "<|START_RESPONSE|>Hi<|END_RESPONSE|>", "Hi"),
    ("Llama 3.x", '{"name": "f", "parameters": {}}', '{"name": "f", "parameters": {}}'),
]


@pytest.mark.parametrize(("fmt", "answer", "content"), NO_TOOLS)
def test_an_answer_without_tools_is_read_for_its_format_markup_only(
    fmt: str, answer: str, content: str
) -> None:
    spec = ToolCallSpec(fmt, (), True, calls=False)
    for chunks in chunkings(answer, seeds=2):
        assert read_answer(chunks, spec) == ParsedMessage(content), chunks


def test_a_fenced_call_stays_content_in_hermes_format() -> None:
    """Qwen2.5-Coder writes its calls in a ```json fence under tool_choice auto. llama.cpp 0c1e570 reads
    Qwen 2.5's template with its generated parser, which takes calls only inside <tool_call> (test-chat.cpp's
    Qwen-Qwen2.5-7B-Instruct cases; common/chat-auto-parser-generator.cpp fences only a schema's answer):
    the fence is content there, and here."""
    tools = (WEATHER,)
    spec = ToolCallSpec("Hermes 2 Pro", tools, True)
    for answer in (
        '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```',
        '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    ):
        for chunks in chunkings(answer, seeds=2):
            assert read_answer(chunks, spec) == ParsedMessage(answer)


@pytest.mark.parametrize(
    ("answer", "content"),
    [
        ('```json\n{"a": "x```"}\n```', '{"a": "x```"}'),
        ('  ```json {"a": 1}```  ', '{"a": 1}'),
        ('{"a": 1}', '{"a": 1}'),
        ('``` {"a": 1}', '``` {"a": 1}'),  # not a json fence
        ('{"a": "```json"}', '{"a": "```json"}'),  # a fence only opens the answer
    ],
)
def test_a_schema_answer_loses_its_json_fence_at_every_chunk_boundary(answer: str, content: str) -> None:
    for fmt in ("Hermes 2 Pro", "Llama 3.x", "Generic"):
        spec = ToolCallSpec(fmt, (), True, calls=False, fenced_json=True)
        for chunks in chunkings(answer, seeds=2):
            assert read_answer(chunks, spec) == ParsedMessage(content), (fmt, chunks)


def test_the_formats_markers_are_rendered_in_the_answer_text(smollm2_gguf: GGUFFile) -> None:
    """A control token the format reads (llama-server's preserved tokens: a GPT-OSS GGUF's
    `<|channel|>`) is text in the answer; other control tokens stay hidden. SmolLM2's `<|im_start|>`
    stands in for one."""
    tokenizer = Tokenizer.from_gguf(smollm2_gguf)
    marker = tokenizer.encode("<|im_start|>", False, True)
    assert len(marker) == 1 and tokenizer.token_to_piece(marker[0], False) == b""  # hidden by default
    hello = tokenizer.encode("Hi", False, False)
    spec = ToolCallSpec("GPT-OSS", (), calls=False, preserved=(marker[0],))
    for request, shown in (
        (GenerationRequest([], tool_calls=spec), "<|im_start|>Hi"),
        (GenerationRequest([]), "Hi"),
    ):
        decoder = answer_decoder(tokenizer, request)
        assert "".join(decoder.push(t) for t in [*marker, *hello]) + decoder.flush() == shown
