"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models (and unprefixed aliases)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from quart import Blueprint, Response, request

from engine.api import GenerationRequest, ReasoningSpec, ReasoningTags, TokenEvent
from server import sse
from server.generation import (
    Outcome,
    build_request,
    collect,
    completion_request,
    events_of,
    has_probs,
    openai_logprobs,
    usage,
)
from server.routes.stream import resumable
from server.schemas import ChatCompletionRequest, GenerationFields
from server.service import ModelService, service
from server.sessions import CONVERSATION_HEADER
from server.structured import tool_plan

bp = Blueprint("openai", __name__)


def base_fields(svc: ModelService, kind: str, completion_id: str, created: int) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": svc.settings.model_alias,
        "system_fingerprint": svc.fingerprint,
    }


# -- chat ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ChatJob:
    """A validated chat request made ready for the engine."""

    prompt_text: str
    n_prompt: int
    request: GenerationRequest


@bp.post("/v1/chat/completions")
@bp.post("/chat/completions")
async def chat_completions() -> Any:
    svc = service()
    body = ChatCompletionRequest.model_validate(await request.get_json(force=True))
    completion_id = svc.new_id("chatcmpl")  # also the engine request id, which control calls name
    job = await prepare_chat(svc, body, completion_id)
    created = int(time.time())
    if body.stream:
        head = base_fields(svc, "chat.completion.chunk", completion_id, created)
        stream = chat_stream(svc, body, job.request, head, job.n_prompt)
        conversation_id = request.headers.get(CONVERSATION_HEADER)
        if conversation_id:  # a resumable session: the generation outlives this response
            stream = await resumable(conversation_id, stream)
        return sse_response(stream)
    out = await collect(svc, job.request)
    reply: dict[str, Any] = {
        **base_fields(svc, "chat.completion", completion_id, created),
        "choices": [chat_choice(svc, body, out)],
        "usage": usage(job.n_prompt, out.final),
    }
    if out.timings:
        reply["timings"] = out.timings.as_dict()
    if body.verbose:
        reply["__verbose"] = {
            "prompt": job.prompt_text,
            "content": out.text,
            "reasoning_content": out.reasoning,
            "tokens": out.tokens,
        }
    return reply


async def prepare_chat(svc: ModelService, body: ChatCompletionRequest, completion_id: str) -> ChatJob:
    """The prompt (rendered for the tools' format when there are tools), its tokens, and the engine
    request with its reasoning, tool-call parsing and grammar; every problem a 400 before any byte."""
    svc.require_ready()
    tools = tool_plan(svc, body)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    prompt_text = svc.render_chat(
        messages,
        tools.tools if tools else None,
        tools.format if tools else None,
        continue_final_message=body.continue_final_message,
        add_generation_prompt=body.add_generation_prompt is not False,
        **thinking_kwargs(svc.settings.reasoning) | (body.chat_template_kwargs or {}),
    )
    tokens, truncated = svc.fit_prompt(await svc.tokenize_prompt(prompt_text))
    svc.log_prompt(completion_id, prompt_text)
    gen = await build_request(svc, body, tokens, body.n_probs(), completion_id, truncated, tools)
    own_tags = tools.format.reasoning_tags if tools else None
    gen = replace(gen, reasoning=reasoning_spec(svc, body, prompt_text, own_tags))
    return ChatJob(prompt_text, len(tokens), gen)


def chat_choice(svc: ModelService, body: ChatCompletionRequest, out: Outcome) -> dict[str, Any]:
    """The one choice of a whole chat reply: the message (content, reasoning, tool calls), why it ended."""
    message: dict[str, Any] = {"role": "assistant", "content": out.text or (None if out.tool_calls else "")}
    if out.reasoning:
        message["reasoning_content"] = out.reasoning
    if out.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in out.tool_calls]
    choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason, "message": message}
    if body.logprobs:
        choice["logprobs"] = {"content": openai_logprobs(svc, out.events)}
    return choice


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


async def chat_stream(
    svc: ModelService,
    body: ChatCompletionRequest,
    gen: GenerationRequest,
    head: dict[str, Any],
    n_prompt: int,
) -> AsyncIterator[bytes]:
    timings: dict[str, Any] = {}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        choice = {"index": 0, "finish_reason": finish, "delta": delta, **extra}
        return sse.event({**head, "choices": [choice], **timings})

    yield chunk({"role": "assistant", "content": None})
    final: TokenEvent | None = None
    async for event in events_of(svc, gen):
        if event.progress is not None:
            yield sse.event({**head, "choices": [], "prompt_progress": event.progress.as_dict()})
            continue
        if event.timings is not None and body.timings_per_token:
            timings = {"timings": event.timings.as_dict()}
        extra = {}
        if body.logprobs and has_probs(event):
            extra["logprobs"] = {"content": openai_logprobs(svc, [event])}
        deltas = event_deltas(event)
        for delta in deltas[:-1]:
            yield chunk(delta)
        if deltas or extra:  # the logprobs ride on the event's last chunk
            yield chunk(deltas[-1] if deltas else {}, **extra)
        if event.finish_reason is not None:
            final = event
    last = {**head, "choices": [{"index": 0, "finish_reason": final_reason(final), "delta": {}}]}
    if final is not None and final.timings is not None:
        last["timings"] = final.timings.as_dict()
    yield sse.event(last)
    if (body.stream_options or {}).get("include_usage"):
        yield sse.event({**head, "choices": [], "usage": usage(n_prompt, final)})
    yield sse.DONE


def event_deltas(event: TokenEvent) -> list[dict[str, Any]]:
    """An event's chunks in the order its parts came: reasoning, content, tool-call steps (llama-server's
    order). No delta carries an empty string."""
    deltas: list[dict[str, Any]] = []
    if event.reasoning_text:
        deltas.append({"reasoning_content": event.reasoning_text})
    if event.text:
        deltas.append({"content": event.text})
    if event.tool_calls:
        deltas.append({"tool_calls": [step.to_openai() for step in event.tool_calls]})
    return deltas


def final_reason(event: TokenEvent | None) -> str:
    return (event.finish_reason if event else None) or "stop"


def sse_response(body: AsyncIterator[bytes]) -> Response:
    response = Response(body, headers=sse.SSE_HEADERS)
    response.timeout = None  # a long generation is not a stuck response
    return response


# -- completions -----------------------------------------------------------------------------------
@bp.post("/v1/completions")
async def completions() -> Any:
    svc = service()
    body, tokens, truncated = await completion_request(svc, await request.get_json(force=True))
    completion_id = svc.new_id("cmpl")
    n_probs = body.logprobs or 0
    gen = await build_request(svc, body, tokens, n_probs, completion_id, truncated)
    created = int(time.time())
    head = base_fields(svc, "text_completion", completion_id, created)
    prefix = body.prompt if body.echo and isinstance(body.prompt, str) else ""
    if body.stream:
        return sse_response(completion_stream(svc, body, gen, head, len(tokens), prefix))
    out = await collect(svc, gen)
    choice = {"index": 0, "text": prefix + out.text, "finish_reason": out.finish_reason, "logprobs": None}
    if n_probs:
        choice["logprobs"] = {"content": openai_logprobs(svc, out.events)}
    reply = {**head, "choices": [choice], "usage": usage(len(tokens), out.final)}
    if out.timings:
        reply["timings"] = out.timings.as_dict()
    return reply


async def completion_stream(
    svc: ModelService, body: GenerationFields, gen: Any, head: dict[str, Any], n_prompt: int, prefix: str
) -> AsyncIterator[bytes]:
    def chunk(text: str, finish: str | None) -> bytes:
        return sse.event(
            {**head, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}
        )

    if prefix:
        yield chunk(prefix, None)
    final: TokenEvent | None = None
    async for event in events_of(svc, gen):
        if event.finish_reason is not None:
            final = event
            yield chunk(event.text, final_reason(event))
        elif event.text:
            yield chunk(event.text, None)
    if (body.stream_options or {}).get("include_usage"):
        yield sse.event({**head, "choices": [], "usage": usage(n_prompt, final)})
    yield sse.DONE


# -- models ----------------------------------------------------------------------------------------
@bp.get("/v1/models")
@bp.get("/models")
async def models() -> Any:
    svc = service()
    meta: dict[str, Any] | None = None
    if svc.ready:
        info = svc.model_info()
        meta = {
            "vocab_type": info.vocab_type,
            "n_vocab": info.n_vocab,
            "n_ctx_train": info.n_ctx_train,
            "n_embd": info.n_embd,
            "n_params": info.n_params,
            "size": info.size,
        }
    entry = {"id": svc.settings.model_alias, "object": "model", "created": int(svc.counters.started)}
    entry |= {"owned_by": "llamacpp", "meta": meta}
    return {
        "object": "list",
        "data": [entry],
        "models": [
            {"name": entry["id"], "model": entry["id"], "type": "model", "capabilities": ["completion"]}
        ],
    }
