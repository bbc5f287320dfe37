"""Ollama's HTTP API on a single-model server: /api/version, /api/tags, /api/show, /api/ps, /api/chat,
/api/generate, /api/embed and /api/embeddings (`GET /` answers "Ollama is running" to a client that does
not ask for HTML: server/apis/webui.py).

Bodies are Ollama's (server/apis/ollama/schemas.py), translated onto the chat path every chat-shaped
route shares (server/chat/job.py); replies are Ollama's objects, streamed as NDJSON unless `stream` is
false (server/http/ndjson.py). Errors have Ollama's shape, `{"error": "message"}`, with its statuses
(server/http/error_handlers.py's `/api` prefix). The model is the server's one model, named as
server/apis/ollama/models.py says.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint

from server.apis.ollama import models
from server.apis.ollama.embed import embed_reply, embeddings_reply
from server.apis.ollama.generate import generate_reply
from server.apis.ollama.generation import nothing, respond, thinking, within_num_ctx
from server.apis.ollama.options import read_options
from server.apis.ollama.replies import Clock, Reply, load_object
from server.apis.ollama.schemas import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from server.apis.ollama.translate import chat_request
from server.chat.generation import new_id
from server.chat.job import prepare_chat
from server.http import errors
from server.http.request_body import json_body
from server.model.host import current_model

bp = Blueprint("ollama", __name__)

# The Ollama version this API speaks: its shapes are those of Ollama 0.12 (VS Code's Copilot Chat asks
# for at least 0.6.4).
VERSION = "0.12.6"


@bp.get("/api/version")
async def version() -> Any:
    return {"version": VERSION}


@bp.get("/api/tags")
async def tags() -> Any:
    """The model this server serves (none listed while it first loads)."""
    model = current_model()
    return {"models": [await models.tags_entry(model)] if model.ready else []}


@bp.get("/api/ps")
async def ps() -> Any:
    """The model while its weights are in memory (not while it loads or sleeps)."""
    model = current_model()
    return {"models": [await models.ps_entry(model)] if model.loaded else []}


@bp.post("/api/show")
async def show() -> Any:
    model = current_model()
    body = OllamaShowRequest.model_validate(await json_body())
    models.resolve(model, body.asked)
    model.require_ready()
    return await models.show(model)


@bp.post("/api/chat")
async def chat() -> Any:
    clock = Clock()
    model = current_model()
    body = OllamaChatRequest.model_validate(await json_body())
    name = models.resolve(model, body.model)
    options = read_options(body.options)
    model.require_ready()  # 503 while the model loads
    if not body.messages:
        return load_object(name, chat=True)
    thinks = thinking(model, body.think, name)
    if body.tools and not model.prompts.describes_tools:
        raise errors.invalid_request(f'"{name}" does not support tools')
    chat_body = chat_request(body, options, thinks).model_copy(
        update={"model": models.adapter_named(model, name)}
    )
    job = await prepare_chat(model, chat_body, new_id("ollama"))
    request = within_num_ctx(job.request, job.n_prompt, options.num_ctx, model.n_ctx_slot)
    clock.ready()
    reply = Reply(name, chat=True, prompts=model.prompts if body.logprobs else None)
    return await respond(model, request, reply, clock, body.streams, nothing)


@bp.post("/api/generate")
async def generate() -> Any:
    clock = Clock()
    model = current_model()
    body = OllamaGenerateRequest.model_validate(await json_body())
    models.resolve(model, body.model)
    model.require_ready()
    return await generate_reply(model, body, clock)


@bp.post("/api/embed")
async def embed() -> Any:
    clock = Clock()
    model = current_model()
    body = OllamaEmbedRequest.model_validate(await json_body())
    models.resolve(model, body.model)
    return await embed_reply(model, body, clock)


@bp.post("/api/embeddings")
async def embeddings() -> Any:
    model = current_model()
    body = OllamaEmbeddingsRequest.model_validate(await json_body())
    models.resolve(model, body.model)
    return await embeddings_reply(model, body)
