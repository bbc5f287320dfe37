"""A chat request made ready for the engine, in one pass: its tools in the model's format, its prompt
(rendered, tokenized, fitted, with its reasoning treatment), and the finished engine request.

Every chat-shaped API goes through here: OpenAI's chat completions as they come, Anthropic's Messages
and OpenAI's Responses once translated into a `ChatCompletionRequest`. One generation path, several
wire shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.api import GenerationRequest
from server.chat.generation import build_request
from server.chat.media import MEDIA_MARKER, media_sources, take_media
from server.chat.schemas import ChatCompletionRequest
from server.chat.structured import tool_plan
from server.config.settings import Settings
from server.model.constraints import ToolPlan
from server.model.host import ModelHost
from server.model.media import MediaPrompt
from server.model.prompts import ChatInput, ReasoningAsk


@dataclass(frozen=True)
class ChatJob:
    """A validated chat request made ready for the engine."""

    prompt_text: str
    n_prompt: int
    request: GenerationRequest
    # Whether a stream sends the prefilled message first: as llama-server, unless the client named
    # continue_final_message (true or a part) without `echo` (the prefill heuristic sends it).
    streams_prefill: bool = True


def streams_prefill(body: ChatCompletionRequest) -> bool:
    return body.continue_final_message in (None, False) or body.echo


async def prepare_chat(
    model: ModelHost, body: ChatCompletionRequest, completion_id: str, answer_only: bool = False
) -> ChatJob:
    """The prompt, its tokens, and the engine request with its reasoning, tool-call parsing and
    grammar; every problem a 400 before any byte. `answer_only`: the tool loop's last round
    (server/chat/structured.py's tool_plan)."""
    prompts = model.prompts  # 503 while the model loads
    tools = tool_plan(prompts, body, answer_only)
    chat, media = await chat_media(model, chat_input(model.settings, body, tools))
    prompt = await prompts.chat(chat, n_keep=body.n_keep, media=media)
    log_prompt(model.settings.log_prompts_dir, completion_id, prompt.text)
    reading = prompts.answer_reading(tools, body.answer_schema() is not None, body.stream)
    request = await build_request(model, body, prompt, body.probs_count(), completion_id, tools, reading)
    return ChatJob(prompt.text, len(prompt.tokens), request, streams_prefill(body))


async def chat_media(model: ModelHost, chat: ChatInput) -> tuple[ChatInput, MediaPrompt | None]:
    """The chat with its media parts made markers, and its media encoded (none: the chat as it was)."""
    encoder = model.media
    modalities = encoder.modalities if encoder is not None else frozenset()
    chat, files = await take_media(chat, modalities, media_sources(model.settings))
    if not files:
        return chat, None
    assert encoder is not None  # take_media refuses media the model cannot read
    return chat, MediaPrompt(MEDIA_MARKER, [await encoder.medium(f.kind, f.data) for f in files])


async def chat_tokens(model: ModelHost, body: ChatCompletionRequest) -> list[int]:
    """The prompt tokens a chat request would run with, before any fitting to the context: what token
    counting answers (/tokenize with messages, Anthropic's count_tokens)."""
    prompts = model.prompts  # 503 while the model loads
    chat, media = await chat_media(model, chat_input(model.settings, body, tool_plan(prompts, body)))
    return (await prompts.chat(chat, fit=False, media=media)).tokens


def chat_input(settings: Settings, body: ChatCompletionRequest, tools: ToolPlan | None) -> ChatInput:
    """The chat as the prompt builder takes it: its messages, its tools in their format, the template
    variables, and what it asks of reasoning (each over the server's defaults)."""
    reasoning = ReasoningAsk(
        body.reasoning_format,
        body.reasoning_budget(settings.reasoning_budget),
        body.budget_message(settings.reasoning_budget_message),
        body.reasoning_control,
    )
    return ChatInput(
        [m.model_dump(exclude_none=True) for m in body.messages],
        tools.tools if tools else None,
        tools.format if tools else None,
        continue_final_message=body.continue_final_message,
        add_generation_prompt=body.add_generation_prompt is not False,
        template_kwargs=template_kwargs(settings, body.reasoning_effort, body.chat_template_kwargs),
        reasoning=reasoning,
    )


def template_kwargs(settings: Settings, effort: str | None, given: dict[str, Any] | None) -> dict[str, Any]:
    """The template variables of a chat: --reasoning's enable_thinking, the reasoning effort (the
    request's, else --reasoning-effort's), then the request's chat_template_kwargs over both."""
    s = settings
    return thinking_kwargs(s.reasoning) | effort_kwargs(effort or s.reasoning_effort) | (given or {})


def thinking_kwargs(mode: str) -> dict[str, Any]:
    """Template variables for --reasoning: on/off set enable_thinking; auto keeps the template's default."""
    return {"on": {"enable_thinking": True}, "off": {"enable_thinking": False}}.get(mode, {})


def effort_kwargs(level: str) -> dict[str, Any]:
    """The template's `reasoning_effort`, unless "default" (the template's own default)."""
    return {} if level == "default" else {"reasoning_effort": level}


def input_tokens(n: int) -> dict[str, Any]:
    """OpenAI's input token count object (llama-server answers its chat count with it too)."""
    return {"object": "response.input_tokens", "input_tokens": n}


def log_prompt(folder: Path | None, request_id: str, text: str) -> None:
    """--log-prompts-dir: each chat's rendered prompt, one file per request."""
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{int(time.time() * 1000)}-{request_id}.txt").write_text(text, encoding="utf-8")
