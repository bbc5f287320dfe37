"""Chat templates: OpenAI-style messages -> prompt text, rendered like llama-server renders them.

Templates are Jinja, run in jinja2's immutable sandbox with the environment Hugging Face's
`apply_chat_template` sets up (trim_blocks, lstrip_blocks, loop controls, `raise_exception`,
`strftime_now`, a `tojson` that keeps non-ASCII text), so the templates shipped in GGUF files render as
their authors tested them. Built-in templates reproduce llama.cpp's hard-coded formats (src/llama-chat.cpp)
as Jinja, so every template has a source to show in /props.

Like llama.cpp (common/chat.cpp), a BOS or EOS string the template emits at the very start or end is
removed when the tokenizer adds that token itself, so it is not doubled. What a template cannot render
(tools, tool calls, tool results, a system turn) is polyfilled as llama.cpp does (template_caps.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.text.template_caps import TemplateCaps, polyfill, probe_caps, tool_call_example
from engine.text.tool_calls.common import Prefill

# How a prefill is written after the generation prompt: (prompt, generation prompt, prefill) ->
# (the prompt before the continued message, the message's text). ToolCallFormat.continue_prompt is one.
Continuation = Callable[[str, str, Prefill], tuple[str, str]]

ROLES = ("system", "user", "assistant", "tool")

# C isspace(): llama.cpp's built-in formats trim with it, Python's str.strip() would trim more.
_TRIM = r"' \t\n\r\v\f'"

# llama.cpp's CHATML_TEMPLATE_SRC, also its fallback for models without a template.
_CHATML = r"""{%- for message in messages -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}"""

# Gemma has no system turn: llama.cpp trims the system text and puts it at the top of the next
# non-model turn, followed by a blank line; "assistant" is called "model".
_GEMMA = (
    r"""{%- set ns = namespace(system='') -%}
{%- for message in messages -%}
{%- if message.role == 'system' -%}
{%- set ns.system = ns.system + (message.content | trim(TRIM)) -%}
{%- else -%}
{%- set role = 'model' if message.role == 'assistant' else message.role -%}
{{- '<start_of_turn>' + role + '\n' -}}
{%- if ns.system and role != 'model' -%}
{{- ns.system + '\n\n' -}}
{%- set ns.system = '' -%}
{%- endif -%}
{{- (message.content | trim(TRIM)) + '<end_of_turn>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<start_of_turn>model\n' -}}
{%- endif -%}"""
).replace("TRIM", _TRIM)

# llama.cpp's llama3 format leaves <|begin_of_text|> to the tokenizer's BOS.
_LLAMA3 = (
    r"""{%- for message in messages -%}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\n\n' + (message.content | trim(TRIM)) -}}
{{- '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}"""
).replace("TRIM", _TRIM)

# llama.cpp's command-r format (CohereForAI/c4ai-command-r-plus): roles other than these three are dropped.
_COMMAND_R = (
    r"""{%- set tokens = {'system': 'SYSTEM', 'user': 'USER', 'assistant': 'CHATBOT'} -%}
{%- for message in messages if message.role in tokens -%}
{{- '<|START_OF_TURN_TOKEN|><|' + tokens[message.role] + '_TOKEN|>' + (message.content | trim(TRIM)) -}}
{{- '<|END_OF_TURN_TOKEN|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>' -}}
{%- endif -%}"""
).replace("TRIM", _TRIM)

BUILTIN_TEMPLATES: dict[str, str] = {
    "chatml": _CHATML,
    "command-r": _COMMAND_R,
    "gemma": _GEMMA,
    "llama3": _LLAMA3,
}


class ChatTemplateError(ValueError):
    """A template that does not compile, or that refuses the messages (e.g. via raise_exception)."""


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    # Character offset in `text` where each message begins (later used for KV checkpoints): for ordinary
    # templates, text before an offset is exactly what the conversation before that message renders to.
    message_starts: list[int]
    # With a prefill (an assistant message continued): its text at the end of `text`, from which the
    # answer is read as the message's continuation, and the message's parts.
    prefill_text: str = ""
    prefill: Prefill | None = None


@dataclass(frozen=True)
class SpecialTokens:
    """The tokenizer's BOS/EOS strings, and whether the tokenizer adds them itself."""

    bos_token: str = ""
    eos_token: str = ""
    add_bos: bool = False
    add_eos: bool = False

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any]) -> SpecialTokens:
        tokens = metadata.get("tokenizer.ggml.tokens") or []
        # llama.cpp's default when the key is absent: SentencePiece vocabularies add BOS, BPE ones do not.
        spm = metadata.get("tokenizer.ggml.model") == "llama"
        return cls(
            bos_token=_token_text(tokens, metadata.get("tokenizer.ggml.bos_token_id")),
            eos_token=_token_text(tokens, metadata.get("tokenizer.ggml.eos_token_id")),
            add_bos=bool(metadata.get("tokenizer.ggml.add_bos_token", spm)),
            add_eos=bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        )


class ChatTemplate:
    def __init__(self, source: str, name: str, special: SpecialTokens | None = None) -> None:
        self.source = source
        self.name = name
        self.special = special or SpecialTokens()
        self._env = _environment()
        try:
            self._template = self._env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            raise ChatTemplateError(f"chat template {name!r} does not compile: {e} (line {e.lineno})") from e

    def __repr__(self) -> str:
        return f"ChatTemplate(name={self.name!r})"

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], override: str | None = None) -> ChatTemplate:
        """The model's template; `override` is a built-in name or a template source (--chat-template).

        A model without a template gets the built-in gemma format if it is a Gemma, else chatml.
        """
        special = SpecialTokens.from_gguf_metadata(metadata)
        if override:
            if override in BUILTIN_TEMPLATES:
                return cls.builtin(override, special)
            return cls(override, "custom", special)
        source = metadata.get("tokenizer.chat_template")
        if source:
            return cls(source, "gguf", special)
        architecture = str(metadata.get("general.architecture", ""))
        return cls.builtin("gemma" if architecture.startswith("gemma") else "chatml", special)

    @classmethod
    def builtin(cls, name: str, special: SpecialTokens | None = None) -> ChatTemplate:
        if name not in BUILTIN_TEMPLATES:
            known = ", ".join(sorted(BUILTIN_TEMPLATES))
            raise ValueError(f"unknown built-in chat template {name!r}; built-in templates are: {known}")
        return cls(BUILTIN_TEMPLATES[name], name, special)

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        with_starts: bool = True,
        continue_final_message: bool | str | None = False,
        continuation: Continuation | None = None,
        **extra: Any,
    ) -> RenderedPrompt:
        """Render messages; `extra` (e.g. enable_thinking) becomes template variables too.

        `continue_final_message` renders the last (assistant) message as the start of the reply the model
        goes on with, as llama-server does: the conversation before it with the generation prompt, then
        its content, unterminated. None continues exactly when the last message is the assistant's
        (llama-server's --prefill-assistant); "content" and "reasoning_content" name the part continued
        (else its reasoning while it has no content). `continuation` writes the message after the
        generation prompt (a format's continue_prompt: its reasoning tags, channels); by default the
        content alone. Message starts cost one render per message (O(n^2) for a
        long chat): `with_starts=False` skips them where only the text is needed. Starts are per message
        as rendered: a system message merged into the next user turn (a template without a system role)
        has none of its own.
        """
        normalised = normalise_messages(messages, typed=self.caps.supports_typed_content)
        continued = _continued_message(normalised, continue_final_message)
        if continued is not None:
            normalised, add_generation_prompt = normalised[:-1], True
        normalised = polyfill(normalised, tools, self.caps, self.tool_call_example if tools else "")
        # llama.cpp always defines enable_thinking (default true); callers override it via `extra`.
        context = {"enable_thinking": True, **_dates(), **extra, **self._special_context()}
        if tools:
            context["tools"] = tools  # llama.cpp leaves `tools` undefined when there are none
        text = self._render(normalised, add_generation_prompt, context)
        prefill, prefill_text = None, ""
        if continued is not None:
            prefill = Prefill.of(_prefill_parts(messages[-1]), continue_final_message)
            before = self._render(normalised, False, context)
            generation_prompt = text[_common_prefix_length(before, text) :]
            text, prefill_text = (continuation or _content_only)(text, generation_prompt, prefill)
            text += prefill_text
        text = self._strip_special(text)
        starts = self._message_starts(normalised, context, text) if with_starts else []
        if continued is not None and with_starts:
            starts.append(
                _common_prefix_length(self._strip_special(self._render(normalised, False, context)), text)
            )
        return RenderedPrompt(text, starts, prefill_text, prefill)

    @cached_property
    def caps(self) -> TemplateCaps:
        """What the template renders by itself (probed once, like llama.cpp does at load)."""
        return probe_caps(self._probe_render)

    @cached_property
    def tool_call_example(self) -> str:
        """A tool call as the template shows it, for the tool list of templates without tool syntax."""
        if self.caps.supports_tools:
            return ""
        return tool_call_example(self._probe_render, self.special.eos_token, self.caps)

    # -- internals -----------------------------------------------------------------------------------

    def _probe_render(
        self, messages: list[dict], tools: list[dict] | None, add_generation_prompt: bool
    ) -> str:
        context: dict[str, Any] = {"enable_thinking": True, **self._special_context()}
        if tools:
            context["tools"] = tools
        try:
            return self._render(messages, add_generation_prompt, context)
        except ChatTemplateError:
            return ""

    def _special_context(self) -> dict[str, str]:
        return {"bos_token": self.special.bos_token, "eos_token": self.special.eos_token}

    def _render(self, messages: list[dict], add_generation_prompt: bool, context: dict[str, Any]) -> str:
        try:
            return self._template.render(
                {**context, "messages": messages, "add_generation_prompt": add_generation_prompt}
            )
        except Exception as e:  # a template can fail in any way Python can (TypeError on None + str...)
            raise ChatTemplateError(f"chat template {self.name!r} failed: {e}") from e

    def _strip_special(self, text: str) -> str:
        bos, eos = self.special.bos_token, self.special.eos_token
        if self.special.add_bos and bos and text.startswith(bos):
            text = text[len(bos) :]
        if self.special.add_eos and eos and text.endswith(eos):
            text = text[: -len(eos)]
        return text

    def _message_starts(self, messages: list[dict], context: dict[str, Any], text: str) -> list[int]:
        """Where each message begins: how much of `text` the conversation before it renders to.

        Rendering each prefix works for any template, including ones that inject a default system
        prompt or merge messages. Where a template closes a conversation differently from how it goes
        on, the prefix is not a prefix of `text` and the start is their longest common prefix, which an
        accidental match can carry a few characters into the message: callers compare tokens before
        reusing a cache anyway. A prefix the template rejects (some demand a user message last) keeps
        the previous start: an earlier offset is always a safe checkpoint. Cost is quadratic in the
        number of messages (~12 ms for 50 on SmolLM2's template, ~140 ms for 200).
        """
        starts: list[int] = []
        for i in range(len(messages)):
            try:
                prefix = self._strip_special(self._render(messages[:i], False, context))
            except ChatTemplateError:
                starts.append(starts[-1] if starts else 0)
                continue
            starts.append(_common_prefix_length(prefix, text))
        return starts


def _content_only(prompt: str, generation_prompt: str, prefill: Prefill) -> tuple[str, str]:
    return prompt, prefill.content


def _prefill_parts(message: Mapping[str, Any]) -> dict[str, Any]:
    """The continued message's reasoning and content; text parts joined by a blank line, as llama.cpp
    renders a continued message (elsewhere parts are joined by a newline)."""
    content = message.get("content")
    if isinstance(content, list):
        content = "\n\n".join(part["text"] for part in content)
    return {"reasoning_content": message.get("reasoning_content"), "content": content}


def _continued_message(messages: list[dict], continue_final_message: bool | str | None) -> dict | None:
    """The assistant message to continue, or None; refuses what llama-server refuses."""
    last = messages[-1] if messages else None
    if continue_final_message is None:
        continue_final_message = last is not None and last["role"] == "assistant"
        if continue_final_message and len(messages) > 1 and messages[-2]["role"] == "assistant":
            raise ValueError("Cannot have 2 or more assistant messages at the end of the list.")
    if not continue_final_message:
        return None
    if last is None or last["role"] != "assistant":
        raise ValueError("continue_final_message needs the last message to be the assistant's")
    if last.get("tool_calls"):
        raise ValueError("Cannot continue an assistant message that contains tool calls.")
    return last


def normalise_messages(messages: Sequence[Mapping[str, Any]], typed: bool = False) -> list[dict]:
    """Validate OpenAI-style messages; copies with `content` flattened to a string (`typed`: a list of
    text parts kept as a list, for a template that reads them)."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise ValueError("'messages' must be a list of message objects")
    return [_normalise_message(i, m, typed) for i, m in enumerate(messages)]


def _normalise_message(index: int, message: Mapping[str, Any], typed: bool = False) -> dict:
    if not isinstance(message, Mapping):
        raise ValueError(f"messages[{index}] must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in ROLES:
        raise ValueError(f"messages[{index}] has invalid role {role!r}; expected one of: {', '.join(ROLES)}")
    if "content" not in message and not message.get("tool_calls"):
        raise ValueError(f"messages[{index}] needs 'content' or 'tool_calls'")
    normalised = dict(message)
    content = message.get("content")
    flat = _flatten_content(index, content)
    typed = typed and isinstance(content, list) and not _has_media(content)  # llama.cpp flattens media
    normalised["content"] = [dict(p) for p in content] if typed else flat
    if normalised.get("tool_calls") == []:  # llama.cpp drops an empty list (some templates refuse one)
        del normalised["tool_calls"]
    return normalised


def _has_media(content: list[Any]) -> bool:
    return any(isinstance(p, Mapping) and p.get("type") == "media_marker" for p in content)


def _flatten_content(index: int, content: Any) -> str:
    """A string, null (-> ""), or a list of text parts joined by newlines, as llama.cpp does for
    templates that take string content; a media marker part (server/chat/media.py) is joined without
    a newline before or after it, as llama.cpp joins them."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ValueError(f"messages[{index}].content must be a string or a list of content parts")
    text, after_marker = "", False
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in ("text", "media_marker"):
            raise ValueError(
                f"messages[{index}].content[{j}] has unsupported type {kind!r}; "
                "only 'text' parts are supported"
            )
        piece = part.get("text")
        if not isinstance(piece, str):
            raise ValueError(f"messages[{index}].content[{j}].text must be a string")
        if kind == "text" and text and not after_marker:
            text += "\n"
        text, after_marker = text + piece, kind == "media_marker"
    return text


class _TemplateEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with llama.cpp's `+`: a string plus null or an undefined variable is the string
    (firefunction-v2 adds a `functions` that llama.cpp never defines; Jinja2 would raise)."""

    intercepted_binops = frozenset({"+"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "+":
            if _is_null(left) and isinstance(right, str):
                return right
            if _is_null(right) and isinstance(left, str):
                return left
        return super().call_binop(context, operator, left, right)


def _is_null(value: Any) -> bool:
    return value is None or isinstance(value, jinja2.Undefined)


def _dates() -> dict[str, str]:
    """llama.cpp's extra template variables: today as Llama 3.x templates (`date_string`) and
    firefunction-v2 (`datetime`) print it; without them those templates print a fixed fallback date."""
    now = datetime.now()
    return {"datetime": now.strftime("%b %d %Y"), "date_string": now.strftime("%d %b %Y")}


def _environment() -> ImmutableSandboxedEnvironment:
    env = _TemplateEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _GenerationTag]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` (HF's marker for assistant-token masks) renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson HTML-escapes and is ASCII-only; templates expect HF's plain json.dumps.
    return json.dumps(
        value,
        ensure_ascii=ensure_ascii,
        indent=indent,
        separators=separators,
        sort_keys=sort_keys,
        default=_json_default,
    )


def _json_default(value: Any) -> Any:
    """What json.dumps cannot take itself: Jinja's lazy sequences (`tools | map(...)` is a generator)
    become lists, undefined values null."""
    if isinstance(value, jinja2.Undefined):
        return None
    if hasattr(value, "__iter__") and not isinstance(value, str | bytes | Mapping):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def _token_text(tokens: Sequence[str], token_id: Any) -> str:
    if token_id is None or not 0 <= int(token_id) < len(tokens):
        return ""
    return str(tokens[int(token_id)])


def _common_prefix_length(a: str, b: str) -> int:
    if b.startswith(a):
        return len(a)
    low, high = 0, min(len(a), len(b))  # invariant: a[:low] == b[:low], a[:high+1] != b[:high+1]
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low
