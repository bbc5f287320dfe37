"""Chat templates against llama-server's renderings (tests/golden) and llama.cpp's built-in formats."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from engine.gguf import GGUFFile
from engine.text.chat import BUILTIN_TEMPLATES, ChatTemplate, ChatTemplateError, SpecialTokens
from tests.conftest import load_golden

# tests/conftest.py EVERY_LEVEL: this module reads tests/golden but runs no kernel.
LEVEL_INDEPENDENT = "chat templates render text (jinja2): no kernel runs"

GEMMA_CHAT = [
    {"role": "system", "content": "  Be brief.\n"},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": " Hello! "},
    {"role": "user", "content": "Bye"},
]


@pytest.fixture(scope="module")
def smollm2_template(smollm2_gguf: GGUFFile) -> ChatTemplate:
    return ChatTemplate.from_gguf_metadata(smollm2_gguf.metadata)


def test_smollm2_template_matches_llama_server(smollm2_template: ChatTemplate) -> None:
    cases = load_golden("smollm2")["chat"]
    assert cases
    for case in cases:
        assert smollm2_template.render(case["messages"]).text == case["prompt"]


def test_smollm2_template_comes_from_the_file(smollm2_template: ChatTemplate, smollm2_gguf: GGUFFile) -> None:
    assert smollm2_template.name == "gguf"
    assert smollm2_template.source == smollm2_gguf.metadata["tokenizer.chat_template"]
    assert smollm2_template.special == SpecialTokens("<|im_start|>", "<|im_end|>", add_bos=False)


def test_message_starts_point_at_each_message(smollm2_template: ChatTemplate) -> None:
    messages = [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ]
    rendered = smollm2_template.render(messages)
    # The template's default system prompt belongs to the first message.
    assert rendered.message_starts[0] == 0
    for start, message in zip(rendered.message_starts[1:], messages[1:], strict=True):
        assert rendered.text.startswith(f"<|im_start|>{message['role']}\n{message['content']}", start)
    # Text before a start is what the earlier conversation renders to on its own: a reusable prefix.
    for i, start in enumerate(rendered.message_starts):
        alone = smollm2_template.render(messages[:i], add_generation_prompt=False).text
        assert rendered.text[:start] == alone


def test_generation_prompt_is_optional(smollm2_template: ChatTemplate) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    with_prompt = smollm2_template.render(messages).text
    without = smollm2_template.render(messages, add_generation_prompt=False).text
    assert with_prompt == without + "<|im_start|>assistant\n"


def test_gemma_model_without_template_uses_builtin_gemma(gemma3_gguf: GGUFFile) -> None:
    template = ChatTemplate.from_gguf_metadata(gemma3_gguf.metadata)
    assert template.name == "gemma"
    assert template.special.add_bos  # Gemma's tokenizer adds <bos>, the template must not
    rendered = template.render(GEMMA_CHAT)
    # llama.cpp: system text trimmed and merged into the first user turn, contents trimmed,
    # "assistant" renamed "model".
    assert rendered.text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    # The system message has no text of its own: it starts where the user turn holding it starts.
    model_turn, last_user = (
        rendered.text.index("<start_of_turn>model"),
        rendered.text.rindex("<start_of_turn>user"),
    )
    assert rendered.message_starts == [0, 0, model_turn, last_user]


def test_override_by_name_and_by_source(smollm2_gguf: GGUFFile) -> None:
    metadata = smollm2_gguf.metadata
    assert ChatTemplate.from_gguf_metadata(metadata, override="gemma").name == "gemma"
    custom = ChatTemplate.from_gguf_metadata(metadata, override="{{ messages[0].content }}!")
    assert custom.name == "custom"
    assert custom.render([{"role": "user", "content": "x"}]).text == "x!"


def test_model_without_template_falls_back_to_chatml() -> None:
    template = ChatTemplate.from_gguf_metadata({"general.architecture": "llama"})
    assert template.name == "chatml"
    text = template.render([{"role": "user", "content": "Hi"}]).text
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_builtin_llama3_format() -> None:
    rendered = ChatTemplate.builtin("llama3").render(
        [{"role": "system", "content": "S "}, {"role": "user", "content": "\tU"}]
    )
    assert rendered.text == (
        "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nU<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    assert rendered.message_starts == [0, rendered.text.index("<|start_header_id|>user")]


def test_builtin_command_r_format() -> None:
    """llama.cpp's command-r format (llama-server --chat-template command-r, its test_apply_chat_template)."""
    rendered = ChatTemplate.builtin("command-r").render(
        [{"role": "system", "content": "You are a test."}, {"role": "user", "content": " Hi there"}]
    )
    assert rendered.text == (
        "<|START_OF_TURN_TOKEN|><|SYSTEM_TOKEN|>You are a test.<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|USER_TOKEN|>Hi there<|END_OF_TURN_TOKEN|>"
        "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
    )


def test_unknown_builtin_lists_the_names() -> None:
    with pytest.raises(ValueError, match="chatml, command-r, gemma, llama3"):
        ChatTemplate.builtin("vicuna")
    assert {"chatml", "command-r", "gemma", "llama3"} <= set(BUILTIN_TEMPLATES)


def test_today_is_llama_cpps_date_variables() -> None:
    """llama.cpp gives every template `date_string` (Llama 3.x prints it as Today Date, else its
    fallback "26 Jul 2024") and `datetime` (firefunction-v2)."""
    source = (
        '{% if not date_string is defined %}{% set date_string = "26 Jul 2024" %}{% endif %}'
        "{{ date_string }}|{{ datetime }}"
    )
    text = ChatTemplate(source, "t").render([{"role": "user", "content": "x"}]).text
    today = datetime.now()
    assert text in {
        f"{day.strftime('%d %b %Y')}|{day.strftime('%b %d %Y')}" for day in (today, today - timedelta(days=1))
    }


def test_a_string_plus_null_or_undefined_is_the_string_as_in_llama_cpp() -> None:
    """firefunction-v2 adds `functions`, which llama.cpp never defines: its jinja reads a string plus
    null or undefined as the string, where Jinja2 raises; other operands still fail."""
    source = "{{ 'a' + functions }}|{{ none + 'b' }}|{{ 'c' + 'd' }}|{{ 1 + 2 }}"
    assert ChatTemplate(source, "t").render([{"role": "user", "content": "x"}]).text == "a|b|cd|3"
    with pytest.raises(ChatTemplateError):
        ChatTemplate("{{ 1 + functions }}", "t").render([{"role": "user", "content": "x"}])


def test_content_parts_are_flattened(smollm2_template: ChatTemplate) -> None:
    parts = [{"type": "text", "text": "Hello"}, {"type": "text", "text": "world"}]
    as_parts = smollm2_template.render([{"role": "user", "content": parts}]).text
    as_string = smollm2_template.render([{"role": "user", "content": "Hello\nworld"}]).text
    assert as_parts == as_string


def test_null_content_with_tool_calls_is_empty_string() -> None:
    source = (
        "{% for m in messages %}[{{ m.content }}"
        "{% for c in m.tool_calls or [] %}|{{ c.function.arguments }}{% endfor %}]{% endfor %}"
    )
    call = {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    text = ChatTemplate(source, "t").render(
        [{"role": "assistant", "content": None, "tool_calls": [call]}], add_generation_prompt=False
    )
    assert text.text == '[|{"a": 1}]'


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([{"role": "robot", "content": "x"}], "invalid role 'robot'"),
        ([{"content": "x"}], "invalid role None"),
        ([{"role": "user"}], "needs 'content' or 'tool_calls'"),
        (["hello"], "must be an object"),
        ([{"role": "user", "content": 3}], "string or a list"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "unsupported type"),
    ],
)
def test_bad_messages_raise(smollm2_template: ChatTemplate, messages: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        smollm2_template.render(messages)


def test_hf_helpers_are_available() -> None:
    source = (
        "{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=1) }}"
        "|{{ strftime_now('%Y') | length }}"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{% endfor %}"
        "{% generation %}|gen{% endgeneration %}"
    )
    text = ChatTemplate(source, "t").render([{"role": "user", "content": "héllo <b>"}]).text
    assert text == '"héllo <b>"|{\n "b": 1,\n "a": [\n  1,\n  2\n ]\n}|4|gen'


def test_trim_and_lstrip_blocks_like_hf() -> None:
    source = (
        "{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content }}]\n  {% endif %}\n{% endfor %}"
    )
    text = ChatTemplate(source, "t").render([{"role": "user", "content": "a"}]).text
    assert text == "[a]\n"


def test_raise_exception_and_template_errors_are_value_errors() -> None:
    refusing = ChatTemplate("{{ raise_exception('roles must alternate') }}", "t")
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        refusing.render([{"role": "user", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate("{% for %}", "broken")


def test_sandbox_blocks_mutation_and_internals() -> None:
    for source in ("{{ messages.append(1) }}", "{{ ''.__class__.__mro__ }}"):
        with pytest.raises(ChatTemplateError):
            ChatTemplate(source, "t").render([{"role": "user", "content": "x"}])


def test_bos_and_eos_emitted_by_template_are_dropped_when_tokenizer_adds_them() -> None:
    source = "{{ bos_token }}{% for m in messages %}<{{ m.content }}>{% endfor %}{{ eos_token }}"
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]

    def render(special: SpecialTokens) -> str:
        return ChatTemplate(source, "t", special).render(messages).text

    assert render(SpecialTokens("<bos>", "<eos>")) == "<bos><a><b><eos>"
    assert render(SpecialTokens("<bos>", "<eos>", add_bos=True)) == "<a><b><eos>"
    both = ChatTemplate(source, "t", SpecialTokens("<bos>", "<eos>", add_bos=True, add_eos=True))
    rendered = both.render(messages)
    assert rendered.text == "<a><b>"
    assert rendered.message_starts == [0, 3]


def test_tools_and_extra_variables_reach_the_template() -> None:
    source = "{% if tools %}{{ tools | length }} tools{% else %}none{% endif %}/{{ enable_thinking }}"
    template = ChatTemplate(source, "t")
    messages = [{"role": "user", "content": "x"}]
    assert template.render(messages, tools=None, enable_thinking=False).text == "none/False"
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    assert template.render(messages, tools=[tool]).text == "1 tools/True"  # llama.cpp's default


def test_template_that_rejects_prefixes_still_gets_starts() -> None:
    # Refuses to render without a final user message, as some real templates do.
    source = (
        "{% if messages[-1].role != 'user' %}{{ raise_exception('last must be user') }}{% endif %}"
        "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    )
    rendered = ChatTemplate(source, "t").render(
        [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"},
        ]
    )
    assert rendered.text == "[a][b][c]"
    # [a][b] is refused, so the last message keeps the previous (earlier, still valid) start.
    assert rendered.message_starts == [0, 3, 3]
