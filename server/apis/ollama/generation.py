"""What /api/chat and /api/generate share once their engine request is built: `num_ctx` applied, the
thinking check, and the run itself, answered as an NDJSON stream (Ollama's default) or one object.

`num_ctx` below the slot's context bounds the request: a prompt of `num_ctx` tokens or more is Ollama's
400 ("the input length exceeds the context length"), and generation stops (done_reason "length") when
prompt and answer fill `num_ctx`. At or above the slot's size it changes nothing: the slots' context is
fixed when the server starts (-c / -np), and /api/ps reports it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

from engine.api import GenerationRequest
from server.apis.ollama.replies import Clock, Reply
from server.apis.ollama.schemas import Think
from server.http import errors, ndjson
from server.model.host import ModelHost

# What a final object adds to Ollama's (a generate's `context`), from the finished reply.
Extra = Callable[[Reply], dict[str, Any]]


def thinking(model: ModelHost, think: Think | None, name: str) -> bool:
    """Whether the template has a thinking block; asking a model without one to think is Ollama's 400."""
    thinks = model.reasoning_tags() is not None
    if not thinks and think not in (None, False):
        raise errors.invalid_request(f'"{name}" does not support thinking')
    return thinks


def within_num_ctx(
    request: GenerationRequest, n_prompt: int, num_ctx: int | None, n_ctx_slot: int
) -> GenerationRequest:
    """The request bounded by a `num_ctx` smaller than the slot's context (see the module's docstring)."""
    if num_ctx is None or num_ctx <= 0 or num_ctx >= n_ctx_slot:
        return request
    if n_prompt >= num_ctx:
        raise errors.invalid_request("the input length exceeds the context length")
    room = num_ctx - n_prompt
    n_predict = room if request.n_predict < 0 else min(request.n_predict, room)
    return replace(request, n_predict=n_predict)


async def respond(
    model: ModelHost, request: GenerationRequest, reply: Reply, clock: Clock, streams: bool, extra: Extra
) -> Any:
    """The run as a stream of objects, or its whole object."""
    n_prompt = len(request.prompt_tokens)
    if streams:
        return ndjson.response(stream(model, request, reply, clock, extra))
    async for event in model.client.events(request):
        reply.feed(event)
    return reply.end(clock.metrics(n_prompt, reply.final), whole=True) | extra(reply)


async def stream(
    model: ModelHost, request: GenerationRequest, reply: Reply, clock: Clock, extra: Extra
) -> AsyncIterator[bytes]:
    async for event in model.client.events(request):
        part = reply.feed(event)
        if part is not None:
            yield ndjson.line(part)
    calls = reply.calls_object()
    if calls is not None:
        yield ndjson.line(calls)
    n_prompt = len(request.prompt_tokens)
    yield ndjson.line(reply.end(clock.metrics(n_prompt, reply.final), whole=False) | extra(reply))


def nothing(reply: Reply) -> dict[str, Any]:
    return {}
