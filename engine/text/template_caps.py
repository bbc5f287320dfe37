"""What a chat template can render, probed as llama.cpp (minja) probes it, and polyfills for the rest.

llama.cpp renders a few dummy conversations through each template to learn its capabilities: does it show
a system message, the tool list, an assistant's tool calls (with arguments as a JSON string or as an
object), tool results? Where it cannot, the messages are rewritten before rendering so the model still
sees them: the tool list becomes a system message, tool calls and tool results become JSON text, a system
message is merged into the next user turn. These polyfills are what lets a template without any tool
syntax (SmolLM2's, Gemma's) take part in the generic tool-call format.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (messages, tools, add_generation_prompt) -> rendered text, or "" when the template refuses them.
RawRender = Callable[[list[dict], list[dict] | None, bool], str]

_USER_NEEDLE = "<User Needle>"
_SYSTEM_NEEDLE = "<System Needle>"
_ARGUMENT_NEEDLE = "argument_needle"
# How a template that understood the arguments shows a key of them (JSON, Python, XML-ish formats).
_ARGUMENT_KEY_FORMS = (
    f'"{_ARGUMENT_NEEDLE}":',
    f"'{_ARGUMENT_NEEDLE}':",
    f"<parameter={_ARGUMENT_NEEDLE}>",
    f"<{_ARGUMENT_NEEDLE}>",
)
_PROBE_TOOL = {
    "name": "some_tool",
    "type": "function",
    "function": {
        "name": "some_tool",
        "description": "Some tool.",
        "parameters": {
            "type": "object",
            "properties": {"arg": {"type": "string", "description": "Some argument."}},
            "required": ["arg"],
        },
    },
}


@dataclass(frozen=True)
class TemplateCaps:
    supports_system_role: bool = True
    supports_tools: bool = False
    supports_tool_calls: bool = False
    supports_tool_responses: bool = False
    supports_tool_call_id: bool = False
    supports_parallel_tool_calls: bool = False
    # Tool-call arguments go to the template parsed into objects: for templates that show object
    # arguments but not string ones (they `tojson` them, or iterate their items). Templates that take
    # both get the client's string as it came, as minja's llama.cpp does.
    requires_object_arguments: bool = False
    # Content given as a list of text parts goes to the template as it came (it iterates them itself:
    # Qwen3.5, Gemma 4), as llama.cpp passes typed content to templates that read both kinds; other
    # templates get the parts' text joined by line breaks.
    supports_typed_content: bool = False


def probe_caps(render: RawRender) -> TemplateCaps:
    user = {"role": "user", "content": _USER_NEEDLE}
    system = {"role": "system", "content": _SYSTEM_NEEDLE}
    supports_system = _SYSTEM_NEEDLE in render([system, user], None, False)
    typed = _renders_typed_content(render)
    supports_tools = "some_tool" in render([user], [_PROBE_TOOL], False)
    arguments = {_ARGUMENT_NEEDLE: "print('Hello, World!')"}
    as_object = _renders_arguments(render([user, _calls_message(("ipython",), arguments)], None, False))
    as_string = _renders_arguments(
        render([user, _calls_message(("ipython",), json.dumps(arguments))], None, False)
    )
    if not (as_object or as_string):
        return TemplateCaps(supports_system, supports_tools, supports_typed_content=typed)
    needs_objects = as_object and not as_string
    probe_arguments: Any = arguments if needs_objects else json.dumps(arguments)
    parallel = render([user, _calls_message(("test_tool1", "test_tool2"), probe_arguments)], None, False)
    response = {
        "role": "tool",
        "name": "test_tool1",
        "content": "Some response!",
        "tool_call_id": "call_911_",
    }
    answered = render([user, _calls_message(("test_tool1",), probe_arguments), response], None, False)
    return TemplateCaps(
        supports_system_role=supports_system,
        supports_tools=supports_tools,
        supports_tool_calls=True,
        supports_tool_responses="Some response!" in answered,
        supports_tool_call_id="call_911_" in answered,
        supports_parallel_tool_calls="test_tool1" in parallel and "test_tool2" in parallel,
        requires_object_arguments=needs_objects,
        supports_typed_content=typed,
    )


def _renders_typed_content(render: RawRender) -> bool:
    """llama.cpp's probe of typed content: a user message whose content is an empty list renders, and
    the template iterates or indexes that list (a template that only tests it, or skips an empty
    content, reads strings)."""
    content = _WatchedList()
    return bool(render([{"role": "user", "content": content}], None, False)) and content.read


class _WatchedList(list):
    """An empty content list that notes whether the template read it as a list."""

    read = False

    def __iter__(self) -> Any:
        # `tojson` writing the list out is no reading of its parts (llama.cpp's probe does not count it)
        self.read = self.read or not sys._getframe(1).f_globals.get("__name__", "").startswith("json")
        return super().__iter__()

    def __getitem__(self, index: Any) -> Any:
        self.read = True
        return super().__getitem__(index)


def _renders_arguments(text: str) -> bool:
    return any(form in text for form in _ARGUMENT_KEY_FORMS)


def _calls_message(names: tuple[str, ...], arguments: Any) -> dict:
    calls = [
        {"id": "call_1___", "type": "function", "function": {"arguments": arguments, "name": name}}
        for name in names
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


def tool_call_example(render: RawRender, eos_token: str, caps: TemplateCaps) -> str:
    """How the (polyfilled) template shows one tool call: the text an assistant turn with a call adds
    after the generation prompt. llama.cpp puts it in the tool list's system message for templates that
    have no tool syntax of their own."""
    user = {"role": "user", "content": "Hey"}
    arguments: Any = {"arg1": "some_value"}
    call = _calls_message(
        ("tool_name",), arguments if caps.requires_object_arguments else json.dumps(arguments)
    )
    prefix = render(polyfill([user], None, caps), None, True)
    full = render(polyfill([user, call], None, caps), None, False)
    if eos_token:
        last_eos = full.rfind(eos_token)
        ends_with_eos_newline = full.endswith("\n") and last_eos == len(full) - len(eos_token) - 1
        if last_eos == len(prefix) - len(eos_token) or ends_with_eos_newline:
            full = full[:last_eos]
    example = full[_shared_prefix_before_tag(prefix, full) :]
    return example if "tool_name" in example or "some_value" in example else ""


def _shared_prefix_before_tag(a: str, b: str) -> int:
    """Length of the common prefix, not counting a trailing '<': DeepSeek R1's generation prompt opens
    `<think>` where the call opens `<｜tool▁calls▁begin｜>`, and the example must keep its own '<'."""
    length = 0
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            break
        if x != "<":
            length = i + 1
    return length


def polyfill(
    messages: list[dict], tools: list[dict] | None, caps: TemplateCaps, example: str = ""
) -> list[dict]:
    """The messages rewritten for what the template cannot render (minja's polyfills, in its order)."""
    has_calls = any(m.get("tool_calls") for m in messages)
    if has_calls and (caps.requires_object_arguments or not caps.supports_tool_calls):
        messages = [_with_object_arguments(m) for m in messages]
    if tools and not caps.supports_tools:
        messages = add_system(messages, _tools_prompt(tools, example))
    if has_calls and not caps.supports_tool_calls:
        messages = [_calls_as_content(m) if m.get("tool_calls") else m for m in messages]
    if not caps.supports_tool_responses:
        messages = [_response_as_user(m) if m["role"] == "tool" else m for m in messages]
    if not caps.supports_system_role:
        messages = _merge_system_into_user(messages)
    return messages


def add_system(messages: list[dict], text: str) -> list[dict]:
    """`text` appended to the first system message (after a blank line; as one more text part of a
    content list; alone when it has no content), or as a new one."""
    if messages and messages[0]["role"] == "system":
        content = messages[0].get("content")
        if isinstance(content, list):
            joined: str | list = [*content, {"type": "text", "text": text}]
        else:
            joined = content + "\n\n" + text if content else text
        return [{**messages[0], "content": joined}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _tools_prompt(tools: list[dict], example: str) -> str:
    text = "You can call any of the following tools to satisfy the user's requests: " + _dump(tools)
    if example:
        text += "\n\nExample tool call syntax:\n\n" + example + "\n\n"
    return text


def _with_object_arguments(message: dict) -> dict:
    if not message.get("tool_calls"):
        return message
    return {**message, "tool_calls": [_parsed_arguments(call) for call in message["tool_calls"]]}


def _parsed_arguments(call: dict) -> dict:
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except json.JSONDecodeError:
        return call  # llama.cpp logs and renders the string as it came
    return {**call, "function": {**function, "arguments": arguments}}


def _calls_as_content(message: dict) -> dict:
    calls = []
    for call in message["tool_calls"]:
        if call.get("type", "function") != "function":
            continue
        function = call["function"]
        entry = {"name": function["name"], "arguments": function.get("arguments")}
        if "id" in call:
            entry["id"] = call["id"]
        calls.append(entry)
    payload: dict[str, Any] = {"tool_calls": calls}
    if message.get("content"):
        payload["content"] = message["content"]
    rest = {k: v for k, v in message.items() if k != "tool_calls"}
    return {**rest, "content": _dump(payload)}


def _response_as_user(message: dict) -> dict:
    response: dict[str, Any] = {}
    if "name" in message:
        response["tool"] = message["name"]
    response["content"] = message["content"]
    if "tool_call_id" in message:
        response["tool_call_id"] = message["tool_call_id"]
    rest = {k: v for k, v in message.items() if k != "name"}
    return {**rest, "role": "user", "content": _dump({"tool_response": response})}


def _merge_system_into_user(messages: list[dict]) -> list[dict]:
    """System text joins the next user message; before any other role it becomes a user message."""
    merged: list[dict] = []
    pending = ""
    for message in messages:
        content = flat_content(message["content"])
        if message["role"] == "system":
            pending = pending + "\n" + content if pending else content
            continue
        if pending and message["role"] == "user":
            message = {**message, "content": pending + ("\n" + content if content else "")}
        elif pending:
            merged.append({"role": "user", "content": pending})
        pending = ""
        merged.append(message)
    if pending:
        merged.append({"role": "user", "content": pending})
    return merged


def flat_content(content: Any) -> Any:
    """A content list's text parts joined by line breaks (llama.cpp's join); other content as it is."""
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content


def _dump(value: Any) -> str:
    # nlohmann's dump(2): two-space indent, ": " after keys, UTF-8 kept.
    return json.dumps(value, indent=2, ensure_ascii=False)
