"""A chat request made ready for the engine: the prompt rendered for the model (and its tools' format),
its tokens, and the engine request with reasoning, tool-call parsing and grammar.

Every chat-shaped API goes through here: OpenAI's chat completions as they come, Anthropic's Messages
and OpenAI's Responses once translated into a `ChatCompletionRequest`. One generation path, several
wire shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from engine.api import GenerationRequest, ReasoningSpec, ReasoningTags
from server.chat.generation import build_request
from server.chat.schemas import ChatCompletionRequest
from server.chat.structured import ToolPlan, tool_plan
from server.model.service import ModelService


@dataclass(frozen=True)
class ChatJob:
    """A validated chat request made ready for the engine."""

    prompt_text: str
    n_prompt: int
    request: GenerationRequest


def chat_prompt(svc: ModelService, body: ChatCompletionRequest, tools: ToolPlan | None) -> str:
    """The chat as the model's prompt (rendered for the tools' format when there are tools)."""
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    return svc.render_chat(
        messages,
        tools.tools if tools else None,
        tools.format if tools else None,
        continue_final_message=body.continue_final_message,
        add_generation_prompt=body.add_generation_prompt is not False,
        **template_kwargs(svc, body.reasoning_effort, body.chat_template_kwargs),
    )


def template_kwargs(svc: ModelService, effort: str | None, given: dict[str, Any] | None) -> dict[str, Any]:
    """The template variables of a chat: --reasoning's enable_thinking, the reasoning effort (the
    request's, else --reasoning-effort's), then the request's chat_template_kwargs over both."""
    s = svc.settings
    return thinking_kwargs(s.reasoning) | effort_kwargs(effort or s.reasoning_effort) | (given or {})


def effort_kwargs(level: str) -> dict[str, Any]:
    """The template's `reasoning_effort`, unless "default" (the template's own default)."""
    return {} if level == "default" else {"reasoning_effort": level}


async def chat_tokens(svc: ModelService, body: ChatCompletionRequest) -> list[int]:
    """The prompt tokens a chat request would run with, before any fitting to the context: what token
    counting answers (/tokenize with messages, Anthropic's count_tokens)."""
    svc.require_ready()
    return await svc.tokenize_prompt(chat_prompt(svc, body, tool_plan(svc, body)))


def input_tokens(n: int) -> dict[str, Any]:
    """OpenAI's input token count object (llama-server answers its chat count with it too)."""
    return {"object": "response.input_tokens", "input_tokens": n}


async def prepare_chat(
    svc: ModelService, body: ChatCompletionRequest, completion_id: str, answer_only: bool = False
) -> ChatJob:
    """The prompt, its tokens, and the engine request with its reasoning, tool-call parsing and
    grammar; every problem a 400 before any byte. `answer_only`: the tool loop's last round
    (server/chat/structured.py's tool_plan)."""
    svc.require_ready()
    tools = tool_plan(svc, body, answer_only)
    prompt_text = chat_prompt(svc, body, tools)
    tokens, truncated = svc.fit_prompt(await svc.tokenize_prompt(prompt_text))
    svc.log_prompt(completion_id, prompt_text)
    gen = await build_request(svc, body, tokens, body.n_probs(), completion_id, truncated, tools)
    own_tags = tools.format.reasoning_tags if tools else None
    gen = replace(gen, reasoning=reasoning_spec(svc, body, prompt_text, own_tags))
    return ChatJob(prompt_text, len(tokens), gen)


def thinking_kwargs(mode: str) -> dict[str, Any]:
    """Template variables for --reasoning: on/off set enable_thinking; auto keeps the template's default."""
    return {"on": {"enable_thinking": True}, "off": {"enable_thinking": False}}.get(mode, {})


def reasoning_spec(
    svc: ModelService, body: ChatCompletionRequest, prompt_text: str, own_tags: ReasoningTags | None
) -> ReasoningSpec | None:
    s = svc.settings
    budget = body.reasoning_budget(s.reasoning_budget)
    message = body.budget_message(s.reasoning_budget_message)
    fmt, control = body.reasoning_format, body.reasoning_control
    return svc.reasoning_spec(fmt, prompt_text, budget, message, control, own_tags)
