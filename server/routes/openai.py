"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models (and unprefixed aliases)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from quart import Blueprint, Response, request

from engine.api import ReasoningSpec, TokenEvent
from server import sse
from server.generation import (
    build_request,
    collect,
    completion_request,
    events_of,
    openai_logprobs,
    usage,
)
from server.routes.stream import resumable
from server.schemas import ChatCompletionRequest, GenerationFields
from server.service import ModelService, service
from server.sessions import CONVERSATION_HEADER

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
@bp.post("/v1/chat/completions")
@bp.post("/chat/completions")
async def chat_completions() -> Any:
    svc = service()
    body = ChatCompletionRequest.model_validate(await request.get_json(force=True))
    svc.require_ready()
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    template_kwargs = thinking_kwargs(svc.settings.reasoning) | (body.chat_template_kwargs or {})
    prompt_text = svc.render_chat(messages, body.tools, **template_kwargs)
    tokens = await svc.tokenize_prompt(prompt_text)
    tokens, truncated = svc.fit_prompt(tokens)
    completion_id = svc.new_id("chatcmpl")  # also the engine request id, which control calls name
    svc.log_prompt(completion_id, prompt_text)
    gen = build_request(svc, body, tokens, body.n_probs(), completion_id, truncated)
    gen = replace(gen, reasoning=reasoning_spec(svc, body, prompt_text))
    created = int(time.time())
    head = base_fields(svc, "chat.completion.chunk", completion_id, created)
    if body.stream:
        stream = chat_stream(svc, body, gen, head, len(tokens))
        conversation_id = request.headers.get(CONVERSATION_HEADER)
        if conversation_id:  # a resumable session: the generation outlives this response
            stream = await resumable(conversation_id, stream)
        return sse_response(stream)
    out = await collect(svc, gen)
    reply: dict[str, Any] = {
        **base_fields(svc, "chat.completion", completion_id, created),
        "choices": [
            {
                "index": 0,
                "finish_reason": out.finish_reason,
                "message": {
                    "role": "assistant",
                    "content": out.text,
                    **({"reasoning_content": out.reasoning} if out.reasoning else {}),
                },
                **({"logprobs": {"content": openai_logprobs(svc, out.events)}} if body.logprobs else {}),
            }
        ],
        "usage": usage(len(tokens), out.final),
    }
    if out.timings:
        reply["timings"] = out.timings.as_dict()
    if body.verbose:
        reply["__verbose"] = {
            "prompt": prompt_text,
            "content": out.text,
            "reasoning_content": out.reasoning,
            "tokens": out.tokens,
        }
    return reply


def thinking_kwargs(mode: str) -> dict[str, Any]:
    """Template variables for --reasoning: on/off set enable_thinking; auto keeps the template's default."""
    return {"on": {"enable_thinking": True}, "off": {"enable_thinking": False}}.get(mode, {})


def reasoning_spec(svc: ModelService, body: ChatCompletionRequest, prompt_text: str) -> ReasoningSpec | None:
    s = svc.settings
    budget = body.reasoning_budget(s.reasoning_budget)
    message = body.budget_message(s.reasoning_budget_message)
    return svc.reasoning_spec(body.reasoning_format, prompt_text, budget, message, body.reasoning_control)


async def chat_stream(
    svc: ModelService, body: ChatCompletionRequest, gen: Any, head: dict[str, Any], n_prompt: int
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
        if body.logprobs and event.logprob is not None:
            extra["logprobs"] = {"content": openai_logprobs(svc, [event])}
        # Reasoning and answer go in separate chunks (reasoning first: it came first); the logprobs ride
        # on the last one. No delta ever carries an empty string.
        if event.reasoning_text:
            yield chunk({"reasoning_content": event.reasoning_text}, **({} if event.text else extra))
        if event.text or (extra and not event.reasoning_text):
            yield chunk({"content": event.text} if event.text else {}, **extra)
        if event.finish_reason is not None:
            final = event
    last = {**head, "choices": [{"index": 0, "finish_reason": final_reason(final), "delta": {}}]}
    if final is not None and final.timings is not None:
        last["timings"] = final.timings.as_dict()
    yield sse.event(last)
    if (body.stream_options or {}).get("include_usage"):
        yield sse.event({**head, "choices": [], "usage": usage(n_prompt, final)})
    yield sse.DONE


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
    gen = build_request(svc, body, tokens, n_probs, completion_id, truncated)
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
