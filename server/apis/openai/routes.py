"""OpenAI-compatible routes: /v1/chat/completions, /v1/completions, /v1/models (and unprefixed aliases),
and vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import structlog
from quart import Blueprint, Response, request

from engine.api import GenerationRequest, TokenEvent
from server.agents.loop import AgentPlan, AgentRun, RoundStarted, ToolExecuted, agent_plan
from server.agents.requests import request_context
from server.agents.toolbox import Toolbox
from server.apis.native.completion import native_final, native_partial, partial_timings
from server.apis.ollama.models import listing_entry
from server.apis.openai.chunks import (
    ChatChunks,
    base_fields,
    chat_choice,
    chat_error_event,
    chat_verbose,
    final_reason,
    wants_verbose,
)
from server.chat.choices import choice_requests, choices_usage, collect_choices, request_timings
from server.chat.generation import (
    build_request,
    collect,
    new_id,
    openai_logprobs,
    raise_if_failed,
    replayable,
    usage,
)
from server.chat.job import ChatJob, chat_tokens, input_tokens, prepare_chat
from server.chat.schemas import (
    ChatCompletionRequest,
    OpenAICompletionRequest,
    PredictRequest,
)
from server.http import errors, sse
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.model.lora import LoraRequestError, UnknownAdapter
from server.model.prompts import Prompt, prefill_message
from server.state import app_state
from server.streams.journal import Recipe, ReplyIds
from server.streams.resumable import resumable, stream_recipe
from server.streams.sessions import CONVERSATION_HEADER

bp = Blueprint("openai", __name__)
log = structlog.get_logger("server")


# -- chat ------------------------------------------------------------------------------------------
@bp.post("/v1/chat/completions")
@bp.post("/chat/completions")
async def chat_completions() -> Any:
    return await chat_reply(current_model(), ChatCompletionRequest.model_validate(await json_body()))


@bp.post("/v1/chat/completions/input_tokens")
@bp.post("/chat/completions/input_tokens")
async def chat_input_tokens() -> Any:
    """llama-server's count of a chat body's prompt tokens (in OpenAI's Responses count shape)."""
    body = ChatCompletionRequest.model_validate(await json_body())
    return input_tokens(len(await chat_tokens(current_model(), body)))


@bp.post("/predict")
async def predict() -> Any:
    """Vertex AI's prediction route (as llama-server serves it): each instance is a chat completion
    request (`"@requestFormat": "chatCompletions"`, not streamed); they run concurrently, and the
    predictions are their replies in order."""
    model = current_model()
    bodies = PredictRequest.model_validate(await json_body()).chat_requests()
    return {"predictions": list(await asyncio.gather(*(chat_reply(model, body) for body in bodies)))}


async def chat_reply(model: ModelHost, body: ChatCompletionRequest) -> Any:
    """The reply to one chat completion request: whole, streamed, n choices, or an MCP tool-loop run."""
    completion_id = new_id("chatcmpl")  # also the engine request id, which control calls name
    model.require_ready()
    plan = await agent_plan(mcp_manager(), model.settings, body, request_context)
    if plan is not None:
        if body.n_choices() > 1:
            raise errors.invalid_request("'n': one choice only when the server runs mcp tools")
        return await agent_completion(model, body, plan, completion_id)
    job = await prepare_chat(model, body, completion_id)
    created = int(time.time())
    if body.n_choices() > 1:
        return await chat_choices(model, body, job, completion_id, created)
    if body.stream:
        ids = ReplyIds(completion_id, created)
        return await streamed(chat_stream_of(model, body, job, ids), replayable(job.request), ids)
    out = await collect(model.client, job.request)
    reply: dict[str, Any] = {
        **base_fields(model, "chat.completion", completion_id, created),
        "choices": [chat_choice(model, body, out, prefix=prefill_message(job.request))],
        "usage": usage(job.n_prompt, out.final),
    }
    if out.timings:
        reply["timings"] = out.timings.as_dict()
    if wants_verbose(model, body):
        reply["__verbose"] = chat_verbose(model, body, job.request, out)
    return reply


async def streamed(stream: AsyncIterator[bytes], deterministic: bool, ids: ReplyIds) -> Response:
    """The SSE response; with X-Conversation-Id a resumable session runs the stream, so the generation
    outlives this response (and, with --stream-journal, a restart: `deterministic` says whether
    running the request again gives the same bytes)."""
    conversation_id = request.headers.get(CONVERSATION_HEADER)
    if conversation_id:
        recipe = await stream_recipe("chat", ids, deterministic)
        session = await resumable(conversation_id, stream, chat_error_event, recipe)
        return sse.response(session, relayed=False, frame=chat_error_event)
    return sse.response(stream, frame=chat_error_event)


def chat_stream_of(
    model: ModelHost, body: ChatCompletionRequest, job: ChatJob, ids: ReplyIds
) -> AsyncIterator[bytes]:
    """One chat's stream, its chunks carrying `ids` (fresh, or a journal's when regenerated)."""
    head = base_fields(model, "chat.completion.chunk", ids.reply_id, ids.created)
    lead = prefill_message(job.request) if job.streams_prefill else ("", "")
    return chat_stream(model, body, job.request, ChatChunks(model, body, head, lead), job.n_prompt)


async def regenerate_chat(model: ModelHost, recipe: Recipe) -> AsyncIterator[bytes]:
    """A journaled chat stream made again after a restart (server/streams/resume.py): the same body,
    the same reply ids."""
    body = ChatCompletionRequest.model_validate(recipe.body)
    job = await prepare_chat(model, body, recipe.ids.reply_id)
    return chat_stream_of(model, body, job, recipe.ids)


def mcp_manager() -> Toolbox | None:
    return app_state().toolbox


async def chat_stream(
    model: ModelHost, body: ChatCompletionRequest, gen: GenerationRequest, chunks: ChatChunks, n_prompt: int
) -> AsyncIterator[bytes]:
    """One chat's stream. Its role chunk (and the prefilled message's, `chunks.lead`: llama-server sends
    a prefill the client did not name as continue_final_message, or with `echo`) opens it at once,
    unless prompt-progress chunks are asked for: those come first, as llama-server's."""
    if not body.return_progress:
        for data in chunks.open():
            yield data
    final: TokenEvent | None = None
    async for event in model.client.events(gen):
        raise_if_failed(event)
        for data in chunks.event(event):
            yield data
        if event.finish_reason is not None:
            final = event
    for data in chunks.end(final, usage(n_prompt, final), verbose=chunks.verbose(gen, final)):
        yield data


async def chat_choices(
    model: ModelHost, body: ChatCompletionRequest, job: ChatJob, completion_id: str, created: int
) -> Any:
    """`n` choices of one chat (server/chat/choices.py): one stream with each chunk's choice index, or one
    reply with n choices; usage and timings count the prompt once."""
    requests = choice_requests(model, job.request, body.n_choices())
    if body.stream:
        head = base_fields(model, "chat.completion.chunk", completion_id, created)
        # Not deterministic as bytes: the choices' chunks interleave as they come.
        lead = prefill_message(job.request) if job.streams_prefill else ("", "")
        stream = chat_choices_stream(model, body, requests, ChatChunks(model, body, head, lead), job.n_prompt)
        return await streamed(stream, False, ReplyIds(completion_id, created))
    outs = await collect_choices(model.client, requests)
    finals = [out.final for out in outs]
    prefix = prefill_message(job.request)
    reply: dict[str, Any] = {
        **base_fields(model, "chat.completion", completion_id, created),
        "choices": [chat_choice(model, body, out, i, prefix) for i, out in enumerate(outs)],
        "usage": choices_usage(job.n_prompt, finals),
    }
    timings = request_timings(finals)
    if timings is not None:
        reply["timings"] = timings.as_dict()
    if wants_verbose(model, body):  # the first choice's, as llama-server answers n choices
        reply["__verbose"] = chat_verbose(model, body, requests[0], outs[0])
    return reply


async def chat_choices_stream(
    model: ModelHost,
    body: ChatCompletionRequest,
    requests: list[GenerationRequest],
    chunks: ChatChunks,
    n_prompt: int,
) -> AsyncIterator[bytes]:
    for index in range(len(requests) if not body.return_progress else 0):
        for data in chunks.open(index):
            yield data
    finals: list[TokenEvent | None] = [None] * len(requests)
    async for index, event in model.client.choice_events(requests):
        raise_if_failed(event)
        for data in chunks.event(event, index):
            yield data
        if event.finish_reason is not None:
            finals[index] = event
            for data in chunks.finish(event, index, verbose=chunks.verbose(requests[index], event, index)):
                yield data
    for data in chunks.end(None, choices_usage(n_prompt, finals), n=len(requests)):
        yield data


# -- chat with the server-side tool loop -----------------------------------------------------------
async def agent_completion(
    model: ModelHost, body: ChatCompletionRequest, plan: AgentPlan, completion_id: str
) -> Any:
    """A chat whose `mcp` tools Llamba runs itself (server/agents/loop.py): one stream, or one reply, for
    the whole run."""
    manager = mcp_manager()
    assert manager is not None  # agent_plan refuses mcp tools without MCP servers

    async def prepare(round_body: ChatCompletionRequest, answer_only: bool) -> ChatJob:
        return await prepare_chat(model, round_body, completion_id, answer_only)

    run = AgentRun(model, body, plan, manager, prepare)
    await run.open()  # the first round's 400s come before any byte (a resumed run's: its own 400s)
    created = int(time.time())
    if body.stream:
        head = base_fields(model, "chat.completion.chunk", completion_id, created)
        # Not run again after a restart: its MCP calls act on the world.
        stream = agent_stream(run, ChatChunks(model, body, head))
        return await streamed(stream, False, ReplyIds(completion_id, created))
    async with contextlib.aclosing(run.events()) as events:
        async for _ in events:
            pass
    if run.error is not None:
        raise run.error
    out = run.final_outcome()
    choice = chat_choice(model, body, out) | {"intermediate_messages": run.messages} | paused(run)
    reply: dict[str, Any] = {
        **base_fields(model, "chat.completion", completion_id, created),
        "choices": [choice],
        "usage": run.usage(),
    }
    if out.timings:
        reply["timings"] = out.timings.as_dict()
    if wants_verbose(model, body) and run.rounds:
        last = run.rounds[-1]
        reply["__verbose"] = chat_verbose(model, body, last.job.request, out) | {"rounds": run.verbose()}
    return reply


async def agent_stream(run: AgentRun, chunks: ChatChunks) -> AsyncIterator[bytes]:
    """The run as one chat stream: each round opens with an assistant delta; an MCP call's deltas are
    followed by its result as a `tool` delta (`tool_call_id`, `name`, `content`, `is_error`)."""
    async with contextlib.aclosing(run.events()) as events:
        async for item in events:
            if isinstance(item, RoundStarted):
                chunks.reopen()
                if not chunks.body.return_progress:  # else the round's progress chunks come first
                    for data in chunks.open():
                        yield data
            elif isinstance(item, ToolExecuted):
                yield chunks.chunk(item.message())
            else:
                for data in chunks.event(item):
                    yield data
    if run.error is not None:
        yield sse.error_event(run.error.body())
        yield sse.DONE
        return
    final = run.final_outcome().final
    verbose = chunks.verbose(run.rounds[-1].job.request, final) if run.rounds else None
    if verbose is not None:
        verbose |= {"rounds": run.verbose()}
    for data in chunks.end(final, run.usage(), verbose=verbose, fields=paused(run)):
        yield data


def paused(run: AgentRun) -> dict[str, Any]:
    """A paused run's choice field (Llamba's): the tools whose calls wait for the user's approval."""
    names = run.pending_approval()
    return {"pending_approval": names} if names else {}


# -- completions -----------------------------------------------------------------------------------
@bp.post("/v1/completions")
async def completions() -> Any:
    model = current_model()
    body, prompt = await completion_prompt(model, await json_body())
    completion_id = new_id("cmpl")
    n_probs = body.n_probs or body.logprobs or 0  # llama-server reads `logprobs` without `n_probs`
    gen = await build_request(model, body, prompt, n_probs, completion_id)
    requests = choice_requests(model, gen, body.n_choices())
    created = int(time.time())
    head = base_fields(model, "text_completion", completion_id, created)
    prefix = body.prompt if body.echo and isinstance(body.prompt, str) else ""
    if body.stream:
        stream = completion_stream(model, body, requests, head, prefix)
        return sse.response(stream, frame=chat_error_event)
    client = model.client
    outs = await collect_choices(client, requests) if len(requests) > 1 else [await collect(client, gen)]
    choices = []
    for index, out in enumerate(outs):
        choice = {
            "index": index,
            "text": prefix + out.text,
            "finish_reason": out.finish_reason,
            "logprobs": None,
        }
        if n_probs:
            choice["logprobs"] = {"content": openai_logprobs(model.prompts, out.events)}
        choices.append(choice)
    finals = [out.final for out in outs]
    reply = {**head, "choices": choices, "usage": choices_usage(len(prompt.tokens), finals)}
    if wants_verbose(model, body):  # the first choice's, as llama-server answers n choices
        reply["__verbose"] = native_final(model, body, requests[0], outs[0].final, whole=outs[0])
    timings = request_timings(finals)
    if timings is not None:
        reply["timings"] = timings.as_dict()
    return reply


async def completion_prompt(model: ModelHost, raw: Any) -> tuple[OpenAICompletionRequest, Prompt]:
    """The body, and its prompt tokens fitted to the context. With `suffix` the
    prompt is the code before the insertion point and the tokens are /infill's FIM layout (no extra
    chunks): llama-server refuses `suffix` here, but OpenAI's clients send it for insertions, and a 501
    naming the missing FIM tokens answers it on a model without them."""
    body = OpenAICompletionRequest.model_validate(raw)
    prompts = model.prompts  # 503 while the model loads
    if body.suffix is None:
        return body, prompts.fit_prompt(await prompts.tokenize_prompt(body.prompt), body.n_keep)
    try:
        tokens = await prompts.infill_prompt(body.prompt, body.suffix, [], "")
    except errors.APIError as exc:
        raise errors.APIError(exc.status, f"'suffix': {exc.message}", exc.error_type) from exc
    return body, prompts.fit_prompt(tokens, body.n_keep)


async def completion_stream(
    model: ModelHost,
    body: OpenAICompletionRequest,
    requests: list[GenerationRequest],
    head: dict[str, Any],
    prefix: str,
) -> AsyncIterator[bytes]:
    """llama-server's completions stream: a chunk per prompt-progress update and per token (the last
    token's too; logprobs and, under timings_per_token, timings on each), then each choice's final chunk
    without text, with its usage and timings (whatever stream_options says: llama-server writes no
    separate usage chunk here). With `verbose` each chunk carries /completion's result as `__verbose`."""
    verbose = wants_verbose(model, body)
    n_prompt = len(requests[0].prompt_tokens)
    new_line = [False] * len(requests)

    def chunk(index: int, text: str, finish: str | None = None, logprobs: Any = None, **top: Any) -> bytes:
        choice = {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}
        return sse.event({**head, "choices": [choice], **top})

    for index in range(len(requests) if prefix else 0):
        yield chunk(index, prefix)
    async for index, event in indexed_events(model, requests):
        raise_if_failed(event)
        new_line[index] = new_line[index] or "\n" in event.text
        if event.finish_reason is None or event.token is not None:
            probs = openai_logprobs(model.prompts, [event]) if requests[index].sampling.n_probs else []
            timed = partial_timings(event, body.timings_per_token)
            top: dict[str, Any] = {}
            if verbose:
                top["__verbose"] = native_partial(event, n_prompt, index, timed, probs)
            if timed and event.timings is not None:
                top["timings"] = event.timings.as_dict()
            if event.progress is not None:
                top["prompt_progress"] = event.progress.as_dict()
            yield chunk(index, event.text, None, {"content": probs} if probs else None, **top)
        if event.finish_reason is not None:
            top = {"usage": usage(n_prompt, event)}
            if verbose:
                gen = requests[index]
                top["__verbose"] = native_final(model, body, gen, event, index, has_new_line=new_line[index])
            if event.timings is not None:
                top["timings"] = event.timings.as_dict()
            yield chunk(index, "", final_reason(event), **top)
    yield sse.DONE


async def indexed_events(
    model: ModelHost, requests: list[GenerationRequest]
) -> AsyncIterator[tuple[int, TokenEvent]]:
    """One request's events (index 0), or n choices' (server/chat/choices.py)."""
    if len(requests) > 1:
        async for item in model.client.choice_events(requests):
            yield item
        return
    async for event in model.client.events(requests[0]):
        yield 0, event


# -- models ----------------------------------------------------------------------------------------
@bp.get("/v1/models")
@bp.get("/models")
async def models() -> Any:
    model = current_model()
    meta: dict[str, Any] | None = None
    if model.ready:
        info = model.model_info()
        meta = {
            "vocab_type": info.vocab_type,
            "n_vocab": info.n_vocab,
            "n_ctx": model.n_ctx_slot,
            "n_ctx_train": info.n_ctx_train,
            "n_embd": info.n_embd,
            "n_params": info.n_params,
            "size": info.size,
            "ftype": info.ftype,
        }
    capabilities = ["completion", "multimodal"] if model.ready and model.modalities else ["completion"]
    entry = {"id": model.settings.model_alias, "object": "model", "created": int(model.counters.started)}
    entry |= {"owned_by": "llamacpp", "meta": meta}
    settings = model.settings
    entry |= {"aliases": settings.aliases, "tags": settings.tag_list}  # the id among them (llama-server's)
    return {
        "object": "list",
        "data": [entry, *adapter_entries(model, entry["id"], entry["created"])],
        "models": [await listing_entry(model, entry["id"], capabilities)],
    }


def adapter_entries(model: ModelHost, parent: str, created: int) -> list[dict[str, Any]]:
    """The LoRA adapters served as models, as vLLM lists its LoRA modules: `root` the adapter's file,
    `parent` the base model's id."""
    return [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llamacpp",
            "root": path,
            "parent": parent,
        }
        for name, path in model.lora.names()
    ]


# -- LoRA adapters at runtime (vLLM's routes) -------------------------------------------------------
@bp.post("/v1/load_lora_adapter")
async def load_lora_adapter() -> Any:
    """vLLM's runtime load: {lora_name, lora_path} -> the adapter served as model `lora_name` (a 400
    names a bad file, an adapter for another base, or a name in use)."""
    model = current_model()
    body = await json_body()
    name, path = (body.get("lora_name"), body.get("lora_path")) if isinstance(body, dict) else (None, None)
    if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
        raise errors.invalid_request("Both 'lora_name' and 'lora_path' must be provided.")
    model.require_ready()
    if name in (model.settings.model_alias, *model.settings.aliases):
        raise errors.invalid_request(f"'{name}' is the base model's name")
    try:
        await anyio.to_thread.run_sync(model.lora.load, name, path)
    except LoraRequestError as exc:
        raise errors.invalid_request(str(exc)) from None
    log.info("model.lora_loaded", name=name, path=path)
    return Response(f"Success: LoRA adapter '{name}' added successfully.", 200, mimetype="text/plain")


@bp.post("/v1/unload_lora_adapter")
async def unload_lora_adapter() -> Any:
    """vLLM's runtime unload: {lora_name}; requests running under it finish, later ones get a 404."""
    model = current_model()
    body = await json_body()
    name = body.get("lora_name") if isinstance(body, dict) else None
    if not isinstance(name, str) or not name:
        raise errors.invalid_request("'lora_name' must be provided.")
    try:
        model.lora.unload(name)
    except UnknownAdapter:
        raise errors.not_found(f"The lora adapter '{name}' cannot be found.") from None
    log.info("model.lora_unloaded", name=name)
    return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200, mimetype="text/plain")
