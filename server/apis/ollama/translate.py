"""Ollama's chat and generate bodies as the chat request every chat-shaped route runs
(server/chat/schemas.py's ChatCompletionRequest), and a raw or fill-in-the-middle generate as a
completion request.

- messages: `images` (base64) become image parts, read by the media path as the OpenAI route's data:
  URLs are; `thinking` is the message's reasoning; `tool_calls` keep their arguments as objects; a tool
  message's `tool_name` is its `name`.
- think: true or a level turns the template's thinking on (a level is its `reasoning_effort`) and the
  answer's thinking is read out of it; false turns it off and closes a block the template opens.
- format: "json" is a JSON object answer, a schema a JSON-schema answer (the response_format constraint).
- options: server/apis/ollama/options.py.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from server.apis.ollama.options import Options
from server.apis.ollama.schemas import (
    Format,
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaGenerationFields,
    OllamaMessage,
    Think,
)
from server.chat.schemas import ChatCompletionRequest, CompletionRequest
from server.http import errors


def chat_request(body: OllamaChatRequest, options: Options, thinks: bool) -> ChatCompletionRequest:
    """The chat of an /api/chat body; `thinks`: the template has a thinking block."""
    fields = {"messages": [chat_message(m) for m in body.messages], "tools": body.tools or None}
    if body.tools and body.tool_choice is not None:
        fields["tool_choice"] = body.tool_choice
    return validated(ChatCompletionRequest, fields | generation_fields(body, options, thinks))


def generate_chat(body: OllamaGenerateRequest, options: Options, thinks: bool) -> ChatCompletionRequest:
    """A templated /api/generate: the system text and the prompt (with its images) as a chat."""
    messages = [OllamaMessage(role="system", content=body.system)] if body.system else []
    messages.append(OllamaMessage(role="user", content=body.prompt, images=body.images))
    fields = {"messages": [chat_message(m) for m in messages]}
    return validated(ChatCompletionRequest, fields | generation_fields(body, options, thinks))


def completion_request(body: OllamaGenerateRequest, options: Options) -> CompletionRequest:
    """A raw or fill-in-the-middle /api/generate: its sampling, limits and format (the prompt is the
    route's)."""
    fields = options.fields | format_fields(body.format) | {"stream": body.streams}
    return validated(CompletionRequest, fields | probs_fields(body, chat=False))


def validated(schema: type[Any], fields: dict[str, Any]) -> Any:
    """The request, or a 400 naming the field (an option's range, a tool's schema)."""
    try:
        return schema.model_validate(fields)
    except ValidationError as exc:
        raise errors.from_validation(exc) from None


def generation_fields(body: OllamaGenerationFields, options: Options, thinks: bool) -> dict[str, Any]:
    fields = options.fields | format_fields(body.format) | think_fields(body.think, thinks)
    return fields | {"stream": body.streams} | probs_fields(body, chat=True)


def probs_fields(body: OllamaGenerationFields, chat: bool) -> dict[str, Any]:
    """Ollama's `logprobs` and `top_logprobs` (0-20)."""
    if not body.logprobs:
        return {}
    if chat:
        return {"logprobs": True, "top_logprobs": body.top_logprobs}
    return {"n_probs": max(1, body.top_logprobs)}


def chat_message(message: OllamaMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": message.role, "content": content(message)}
    if message.thinking:
        out["reasoning_content"] = message.thinking
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id or f"call_{i}",
                "type": "function",
                "function": {"name": call.function.name, "arguments": call.function.arguments},
            }
            for i, call in enumerate(message.tool_calls)
        ]
    if message.role == "tool":
        if message.tool_name:
            out["name"] = message.tool_name
        if message.tool_call_id:
            out["tool_call_id"] = message.tool_call_id
    return out


def content(message: OllamaMessage) -> str | list[dict[str, Any]]:
    """The text, or with images the parts the media path reads, placed as Ollama places them: image i
    takes the i-th `[img]` placeholder of the text, and the images left over go before the text."""
    if not message.images:
        return message.content
    pieces = message.content.split("[img]")
    inline = min(len(pieces) - 1, len(message.images))
    parts = [image_part(image) for image in message.images[inline:]]
    for i, piece in enumerate(pieces[: inline + 1]):
        text = "[img]".join(pieces[inline:]) if i == inline else piece
        if text:
            parts.append({"type": "text", "text": text})
        if i < inline:
            parts.append(image_part(message.images[i]))
    return parts


def image_part(image: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": f"data:image/unknown;base64,{image}"}}


def format_fields(fmt: Format | None) -> dict[str, Any]:
    if not fmt:
        return {}
    if fmt == "json":
        return {"response_format": {"type": "json_object"}}
    if not isinstance(fmt, dict):
        raise errors.invalid_request(f'invalid format: {fmt!r}: expected "json" or a valid JSON schema')
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": fmt}}}


def think_fields(think: Think | None, thinks: bool) -> dict[str, Any]:
    """Ollama's `think` on a template with a thinking block (Ollama thinks by default there); on a
    template without one, anything but a true value has nothing to change."""
    if think is None:
        return {"reasoning_format": "auto"} if thinks else {}
    if think is False:
        return {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_budget_tokens": 0}
    fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": True}, "reasoning_format": "auto"}
    if isinstance(think, str):
        fields["reasoning_effort"] = think
    return fields
