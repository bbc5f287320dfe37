"""The published contract, `GET /openapi.json`: an OpenAPI 3.1 document built from one route table and
the pydantic request models the routes validate with (their `model_json_schema`), so the models stay
the single source of truth and the document cannot drift from what the server accepts.

Assembled here rather than with quart-schema: quart-schema documents a route through the decorators
that also validate it (`validate_request` hands the handler a parsed model and answers its own 400
shape), so adopting it means rewriting every route's signature and error path; the routes here validate
once, in the handler, with the same models this table names. tests/test_openapi_server.py checks that
every route the app serves is in the table (and so in the document).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, RootModel, StrictBool, StrictStr
from pydantic.json_schema import models_json_schema

from server.agents.requests import ToolCallRequest
from server.apis.anthropic.schemas import CountTokensRequest, MessagesRequest
from server.apis.embeddings.schemas import EmbeddingsBody, RerankBody
from server.apis.ollama.schemas import (
    OllamaChatRequest,
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OllamaGenerateRequest,
    OllamaShowRequest,
)
from server.apis.responses.schemas import ResponsesRequest
from server.chat.schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    ControlRequest,
    DetokenizeRequest,
    InfillRequest,
    PredictRequest,
    SlotActionRequest,
    StreamLookupRequest,
    TokenizeRequest,
)


class ErrorDetail(BaseModel):
    code: int
    message: str
    type: str


class ErrorReply(BaseModel):
    """OpenAI's error shape: every route but Anthropic's."""

    model_config = ConfigDict(extra="allow")
    error: ErrorDetail


class AnthropicErrorDetail(BaseModel):
    type: str
    message: str


class ModelName(BaseModel):
    """A router request naming one model of its catalogue (its id or an alias)."""

    model: str = Field(min_length=1)


class OllamaPullRequest(BaseModel):
    """Ollama's /api/pull in router mode: a catalogue model to fetch (`name`: its deprecated spelling)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = ""
    name: StrictStr = ""
    insecure: StrictBool = False  # accepted: the router fetches from no registry
    stream: StrictBool | None = None  # absent: NDJSON progress; false: the last status alone


class OllamaDeleteRequest(BaseModel):
    """Ollama's /api/delete in router mode: a cached catalogue model to remove."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = ""
    name: StrictStr = ""


class LoraScale(BaseModel):
    """An adapter's global scale (llama-server's POST /lora-adapters item)."""

    id: int = Field(ge=0)
    scale: float


class LoraScalesRequest(RootModel[list[LoraScale]]):
    """llama-server's POST /lora-adapters body: the adapters' global scales, unlisted ones set to 0."""


class LoadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/load_lora_adapter body: the adapter file, served as model `lora_name`."""

    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)


class UnloadLoraAdapterRequest(BaseModel):
    """vLLM's POST /v1/unload_lora_adapter body."""

    lora_name: str = Field(min_length=1)


class AnthropicErrorReply(BaseModel):
    """Anthropic's error shape: /v1/messages and /v1/messages/count_tokens."""

    type: str = Field(pattern="^error$")
    error: AnthropicErrorDetail


class OllamaErrorReply(BaseModel):
    """Ollama's error shape: its /api/* routes."""

    error: str


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    required: bool = False
    schema: tuple[tuple[str, Any], ...] = (("type", "string"),)


@dataclass(frozen=True)
class Route:
    """One operation (method) on one or more paths (llama-server's aliases), and its body model."""

    method: str
    paths: tuple[str, ...]
    summary: str
    body: type[BaseModel] | tuple[type[BaseModel], ...] | None = None
    query: tuple[Query, ...] = ()
    streams: bool = False  # may answer text/event-stream
    anthropic: bool = False  # errors in Anthropic's shape
    content: str = "application/json"  # the success reply's type
    ollama: bool = False  # errors in Ollama's shape; `streams` means NDJSON


_CONV_ID = Query("conv_id", "the conversation id the stream was started with (X-Conversation-Id)", True)
_FROM = Query("from", "byte offset to replay from", schema=(("type", "string"), ("pattern", "^[0-9]*$")))
_PROXY_URL = Query("url", "the MCP server's URL the request is forwarded to", True)
_SLOT_ACTION = Query("action", "what to do with the slot", True, (("enum", ["save", "restore", "erase"]),))

ROUTES: tuple[Route, ...] = (
    Route("post", ("/v1/chat/completions", "/chat/completions"), "chat completion (OpenAI)",
          ChatCompletionRequest, streams=True),
    Route("post", ("/v1/chat/completions/input_tokens", "/chat/completions/input_tokens"),
          "count a chat's prompt tokens (llama-server)", ChatCompletionRequest),
    Route("post", ("/v1/chat/completions/control", "/chat/completions/control"),
          "act on a running chat completion", ControlRequest),
    Route("post", ("/predict",), "Vertex AI prediction: chat completion instances", PredictRequest),
    Route("post", ("/v1/completions",), "text completion (OpenAI)", CompletionRequest, streams=True),
    Route("post", ("/completion", "/completions"), "text completion (llama-server)", CompletionRequest,
          streams=True),
    Route("post", ("/infill",), "fill in the middle (llama-server)", InfillRequest, streams=True),
    Route("post", ("/tokenize",), "tokenize text, or a chat's prompt",
          (TokenizeRequest, ChatCompletionRequest)),
    Route("post", ("/detokenize",), "token ids to text", DetokenizeRequest),
    Route("post", ("/apply-template",), "a chat's prompt text", ApplyTemplateRequest),
    Route("post", ("/v1/messages",), "message (Anthropic)", MessagesRequest, streams=True, anthropic=True),
    Route("post", ("/v1/messages/count_tokens",), "count a message's tokens (Anthropic)", CountTokensRequest,
          anthropic=True),
    Route("post", ("/v1/responses", "/responses"), "create a response (OpenAI Responses)", ResponsesRequest,
          streams=True),
    Route("post", ("/v1/responses/input_tokens", "/responses/input_tokens"),
          "count a response's input tokens (OpenAI Responses)", ResponsesRequest),
    Route("get", ("/v1/responses/{response_id}", "/responses/{response_id}"), "a stored response",
          query=(Query("stream", "true: replay a background response's events"),
                 Query("starting_after", "replay events after this sequence number")), streams=True),
    Route("post", ("/v1/responses/{response_id}/cancel", "/responses/{response_id}/cancel"),
          "cancel a background response"),
    Route("delete", ("/v1/responses/{response_id}", "/responses/{response_id}"), "delete a stored response"),
    Route("post", ("/embedding", "/embeddings", "/v1/embeddings"), "embeddings (--embedding)",
          EmbeddingsBody),
    Route("post", ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking"), "rerank (--reranking)",
          RerankBody),
    Route("get", ("/v1/stream",), "replay and follow a resumable stream", query=(_CONV_ID, _FROM),
          streams=True),
    Route("delete", ("/v1/stream",), "stop a resumable stream", query=(_CONV_ID,)),
    Route("post", ("/v1/streams/lookup",), "resumable streams' state", StreamLookupRequest),
    Route("get", ("/health", "/v1/health"), "readiness: 200 once the model is loaded"),
    Route("get", ("/props",), "the server's settings and model"),
    Route("post", ("/props",), "change global properties (--props; none yet: an empty object)"),
    Route("get", ("/v1/models", "/models"), "the served model (and its LoRA adapters served as models)"),
    Route("get", ("/slots",), "what each slot does"),
    Route("get", ("/slots/prefixes",), "the prompt cache's block hashes, busy slots, queue"),
    Route("post", ("/slots/{id_slot}",), "save, restore or erase a slot's cache", SlotActionRequest,
          query=(_SLOT_ACTION,)),
    Route("get", ("/metrics",), "Prometheus metrics (--metrics)", content="text/plain"),
    Route("get", ("/cors-proxy",), "the web UI's MCP proxy (--ui-mcp-proxy; else 403)", query=(_PROXY_URL,)),
    Route("post", ("/cors-proxy",), "the web UI's MCP proxy (--ui-mcp-proxy; else 403)", query=(_PROXY_URL,)),
    Route("get", ("/tools",), "the MCP servers' tools (with MCP servers configured)"),
    Route("post", ("/tools",), "call an MCP tool (with MCP servers configured)", ToolCallRequest),
    Route("get", ("/lora-adapters",), "the loaded LoRA adapters and their global scales"),
    Route("post", ("/lora-adapters",), "set the LoRA adapters' global scales", LoraScalesRequest),
    Route("post", ("/v1/load_lora_adapter",), "load a LoRA adapter served as a model (vLLM's)",
          LoadLoraAdapterRequest, content="text/plain"),
    Route("post", ("/v1/unload_lora_adapter",), "unload a LoRA adapter served as a model (vLLM's)",
          UnloadLoraAdapterRequest, content="text/plain"),
    Route("get", ("/openapi.json",), "this document"),
    Route("get", ("/",), "the web UI (HTML); Ollama's \"Ollama is running\" to a client not asking for HTML",
          content="text/html"),
    Route("get", ("/index.html",), "the web UI", content="text/html"),
    Route("get", ("/api/version",), "the Ollama version this API speaks (Ollama)", ollama=True),
    Route("get", ("/api/tags",), "the served model (Ollama)", ollama=True),
    Route("get", ("/api/ps",), "the loaded model (Ollama)", ollama=True),
    Route("post", ("/api/show",), "the model's details, metadata and capabilities (Ollama)",
          OllamaShowRequest, ollama=True),
    Route("post", ("/api/chat",), "chat (Ollama; NDJSON unless stream is false)", OllamaChatRequest,
          streams=True, ollama=True),
    Route("post", ("/api/generate",), "generate: templated, raw or fill-in-the-middle (Ollama)",
          OllamaGenerateRequest, streams=True, ollama=True),
    Route("post", ("/api/embed",), "embeddings of texts (Ollama; --embedding)", OllamaEmbedRequest,
          ollama=True),
    Route("post", ("/api/embeddings",), "one prompt's embedding (Ollama's older route; --embedding)",
          OllamaEmbeddingsRequest, ollama=True),
    Route("get", ("/assets/{relative}",), "the web UI's files", content="application/octet-stream"),
)  # fmt: skip


_MODEL_QUERY = Query("model", "a model of the catalogue: that model's child answers")

# The router's own routes (server/router/app.py); every other path is proxied to the child of the model
# that the body's (or the query's) `model` names, the default model without one.
ROUTER_ROUTES: tuple[Route, ...] = (
    Route("get", ("/health", "/v1/health"), "the router is up (models load on demand)"),
    Route("get", ("/v1/models", "/models"), "the catalogue with each model's state",
          query=(Query("reload", "1: rescan the models directory and presets first"),)),
    Route("get", ("/v1/models/{name}",), "one model's state"),
    Route("post", ("/models/load",), "start a model's child", ModelName),
    Route("post", ("/models/unload",), "stop a model's child, or cancel its download", ModelName),
    Route("post", ("/models",), "download a built-in model into the cache", ModelName),
    Route("delete", ("/models",), "remove a built-in model's file from the cache",
          query=(Query("model", "the model", True),)),
    Route("get", ("/models/sse",), "model states and load progress, as they change", streams=True),
    Route("get", ("/metrics",), "every model's metrics labelled by model, and the router's",
          query=(_MODEL_QUERY,), content="text/plain"),
    Route("get", ("/props",), "the router's settings (and the default model's)", query=(_MODEL_QUERY,)),
    Route("get", ("/api/tags",), "every catalogue model on this machine, loaded or not (Ollama)",
          ollama=True),
    Route("get", ("/api/ps",), "the running models, with when their keep_alive unloads them (Ollama)",
          ollama=True),
    Route("post", ("/api/pull",), "fetch a built-in model into the cache (Ollama; NDJSON progress unless "
          "stream is false)", OllamaPullRequest, streams=True, ollama=True),
    Route("delete", ("/api/delete",), "remove a cached model (Ollama)", OllamaDeleteRequest, ollama=True),
)  # fmt: skip


def router_routes() -> tuple[Route, ...]:
    """What a router serves: its own routes, and the model server's behind it (proxied) on other paths."""
    own = {(route.method, path) for route in ROUTER_ROUTES for path in route.paths}
    proxied = []
    for route in ROUTES:
        paths = tuple(p for p in route.paths if (route.method, p) not in own)
        if paths:
            proxied.append(replace(route, paths=paths))
    return ROUTER_ROUTES + tuple(proxied)


def _body_models(route: Route) -> tuple[type[BaseModel], ...]:
    if route.body is None:
        return ()
    return route.body if isinstance(route.body, tuple) else (route.body,)


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _path_params(path: str) -> list[dict[str, Any]]:
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}} for n in names]


def _operation_id(method: str, path: str) -> str:
    name = path.strip("/").replace("/", "_").replace("{", "").replace("}", "").replace(".", "_")
    return f"{method}_{name or 'root'}"


def _error_model(route: Route) -> type[BaseModel]:
    return AnthropicErrorReply if route.anthropic else OllamaErrorReply if route.ollama else ErrorReply


def _replies(route: Route) -> dict[str, Any]:
    error = {"application/json": {"schema": _ref(_error_model(route))}}
    ok: dict[str, Any] = {route.content: {"schema": {"type": "object"}}}
    if not route.content.endswith("json"):
        ok = {route.content: {"schema": {"type": "string"}}}
    if route.streams:
        ok["application/x-ndjson" if route.ollama else "text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "200": {"description": "success", "content": ok},
        "4XX": {"description": "the request is wrong", "content": error},
        "503": {"description": "the model is loading, or the queue is full (Retry-After)", "content": error},
    }


def _operation(route: Route, path: str) -> dict[str, Any]:
    models = _body_models(route)
    query = [
        {"name": q.name, "in": "query", "required": q.required, "description": q.description,
         "schema": dict(q.schema)}
        for q in route.query
    ]  # fmt: skip
    op: dict[str, Any] = {
        "summary": route.summary,
        "operationId": _operation_id(route.method, path),
        "parameters": _path_params(path) + query,
        "responses": _replies(route),
    }
    if models:
        schema = _ref(models[0]) if len(models) == 1 else {"oneOf": [_ref(m) for m in models]}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    return op


def _components(routes: tuple[Route, ...]) -> dict[str, Any]:
    models = {m for route in routes for m in _body_models(route)} | {ErrorReply, AnthropicErrorReply}
    models |= {OllamaErrorReply}
    ordered = sorted(models, key=lambda m: m.__name__)
    _, defs = models_json_schema(
        [(m, "validation") for m in ordered], ref_template="#/components/schemas/{model}"
    )
    return defs.get("$defs", {})


def document(version: str, router: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route of a model server, or of a router."""
    routes = router_routes() if router else ROUTES
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        for path in route.paths:
            paths.setdefault(path, {})[route.method] = _operation(route, path)
    description = (
        "llama-server's, OpenAI's, Anthropic's and Ollama's HTTP APIs. Errors: OpenAI's shape "
        "{error: {code, message, type}}, Anthropic's on /v1/messages, Ollama's {error: message} on /api."
    )
    if router:
        description += (
            " A router of several models: a request's `model` (in its body, or the query) picks the "
            "model whose server answers; the router's own routes manage the models."
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Llamba router" if router else "Llamba",
            "version": version,
            "description": description,
        },
        "paths": paths,
        "components": {"schemas": _components(routes)},
    }


@cache
def cached_document(router: bool = False) -> dict[str, Any]:
    try:
        return document(version("llamba"), router)
    except PackageNotFoundError:
        return document("unknown", router)
