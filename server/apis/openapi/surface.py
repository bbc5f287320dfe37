"""llama-server's and OpenAI's routes and request fields, and what Llamba does with each.

`docs/compatibility.md` is generated from this (scripts/compatibility_doc.py) and
tests/test_api_surface.py keeps it true: an implemented route is registered (with its method) on the
app of its mode and every registered route has a row; a field's status is not written here but read
from the request schema that serves it (`server/chat/schemas.py`) and `server/chat/unsupported.py`.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from server.apis.native.completion import NativeCompletionRequest
from server.chat.schemas import (
    ChatCompletionRequest,
    InfillRequest,
    OpenAICompletionRequest,
)
from server.chat.unsupported import ACCEPTED, METADATA, NOT_YET

# Where a route exists: the one-model server, the router (no -m), the server with tools (built-in or MCP
# servers), the server with --ui-mcp-proxy.
SERVER, ROUTER, MCP = "server", "router", "server with --tools or MCP servers"
PROXY = "server with --ui-mcp-proxy"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    origin: str  # llama-server | OpenAI | Anthropic | Ollama | vLLM | Llamba
    implemented: bool
    note: str = ""
    mode: str = SERVER


R = Route
ROUTES: tuple[Route, ...] = (
    R("GET", "/health", "llama-server", True, "503 while the model loads; no API key needed"),
    R("GET", "/v1/health", "llama-server", True, "as /health"),
    R(
        "GET",
        "/metrics",
        "llama-server",
        True,
        "with --metrics; llama-server's `llamacpp:*` names, and vLLM's latency histograms (`llamba:*`)",
    ),
    R("GET", "/props", "llama-server", True, "also Llamba's reasoning and tool-loop settings"),
    R(
        "POST",
        "/props",
        "llama-server",
        True,
        "with --props: an empty object (llama-server has no options yet)",
    ),
    R("GET", "/models", "llama-server", True),
    R("GET", "/v1/models", "OpenAI", True),
    R("POST", "/completion", "llama-server", True),
    R("POST", "/completions", "llama-server", True, "as /completion"),
    R("POST", "/v1/completions", "OpenAI", True, "`suffix` runs as /infill on a model with FIM tokens"),
    R("POST", "/chat/completions", "llama-server", True, "as /v1/chat/completions"),
    R("POST", "/v1/chat/completions", "OpenAI", True, "tools, structured output, the MCP tool loop"),
    R("POST", "/predict", "Vertex AI", True, "chat completion instances (@requestFormat), concurrently"),
    R("POST", "/v1/chat/completions/control", "llama-server", True, "reasoning_end on a running chat"),
    R("POST", "/chat/completions/control", "Llamba", True, "as /v1/chat/completions/control"),
    R("POST", "/v1/responses", "OpenAI", True, "stored, background, MCP tools"),
    R("POST", "/responses", "llama-server", True, "as /v1/responses"),
    R("GET", "/v1/responses/<response_id>", "OpenAI", True, "`starting_after` follows a stream"),
    R("GET", "/responses/<response_id>", "Llamba", True, "as /v1/responses/{id}"),
    R("DELETE", "/v1/responses/<response_id>", "OpenAI", True),
    R("DELETE", "/responses/<response_id>", "Llamba", True, "as /v1/responses/{id}"),
    R("POST", "/v1/responses/<response_id>/cancel", "OpenAI", True),
    R("POST", "/responses/<response_id>/cancel", "Llamba", True, "as /v1/responses/{id}/cancel"),
    R("POST", "/v1/responses/input_tokens", "OpenAI", True, "after the conversation it continues"),
    R("POST", "/responses/input_tokens", "llama-server", True, "as /v1/responses/input_tokens"),
    R("POST", "/v1/chat/completions/input_tokens", "llama-server", True, "a chat body's prompt tokens"),
    R("POST", "/chat/completions/input_tokens", "llama-server", True, "as /v1/chat/completions/input_tokens"),
    R("POST", "/v1/audio/transcriptions", "OpenAI", False, "404: no audio models"),
    R("POST", "/audio/transcriptions", "llama-server", False, "404: no audio models"),
    R("POST", "/v1/messages", "Anthropic", True, "whole or its named event stream"),
    R("POST", "/v1/messages/count_tokens", "Anthropic", True),
    R("POST", "/infill", "llama-server", True, "501 on a model without FIM tokens"),
    R("POST", "/embedding", "llama-server", True, "with --embedding"),
    R("POST", "/embeddings", "llama-server", True, "with --embedding"),
    R("POST", "/v1/embeddings", "OpenAI", True, "with --embedding; float or base64"),
    R("POST", "/rerank", "llama-server", True, "with --reranking"),
    R("POST", "/reranking", "llama-server", True, "with --reranking"),
    R("POST", "/v1/rerank", "llama-server", True, "with --reranking"),
    R("POST", "/v1/reranking", "llama-server", True, "with --reranking"),
    R("POST", "/tokenize", "llama-server", True, "also a chat's `messages`"),
    R("POST", "/detokenize", "llama-server", True),
    R("POST", "/apply-template", "llama-server", True),
    R("GET", "/lora-adapters", "llama-server", True, "the --lora/--lora-scaled adapters; [] without any"),
    R("POST", "/lora-adapters", "llama-server", True, "sets the global scales; an unknown id is a 400"),
    R("POST", "/v1/load_lora_adapter", "vLLM", True, "an adapter served as a model; a bad file is a 400"),
    R("POST", "/v1/unload_lora_adapter", "vLLM", True, "requests under it finish; an unknown name is a 404"),
    R("GET", "/slots", "llama-server", True, "not with --no-slots"),
    R("POST", "/slots/<id_slot>", "llama-server", True, "save, restore, erase (with --slot-save-path)"),
    R(
        "GET",
        "/slots/prefixes",
        "Llamba",
        True,
        "the prompt cache's block hashes (the cluster router places by them)",
    ),
    R("GET", "/openapi.json", "Llamba", True, "the API as OpenAPI 3.1, from the request models"),
    R("GET", "/v1/stream", "llama-server", True, "resume a stream by conversation id and offset"),
    R("DELETE", "/v1/stream", "llama-server", True, "stop a resumable stream"),
    R("POST", "/v1/streams/lookup", "llama-server", True),
    R(
        "GET",
        "/cors-proxy",
        "llama-server",
        True,
        "with --ui-mcp-proxy, forwards only x-llama-server-proxy-header-*; 403 without",
        SERVER,
    ),
    R(
        "POST",
        "/cors-proxy",
        "llama-server",
        True,
        "with --ui-mcp-proxy, forwards only x-llama-server-proxy-header-*; 403 without",
        SERVER,
    ),
    R("GET", "/api/version", "Ollama", True, "0.12.6: the Ollama API's shapes; no API key needed"),
    R("GET", "/api/tags", "Ollama", True, "the served model as `<alias>:latest`; no API key needed"),
    R("GET", "/api/ps", "Ollama", True, "the loaded model (host memory: size_vram 0; never expires)"),
    R("POST", "/api/show", "Ollama", True, "details, GGUF metadata, capabilities, template"),
    R("POST", "/api/chat", "Ollama", True, "tools, think, format, images (--mmproj), options; NDJSON"),
    R("POST", "/api/generate", "Ollama", True, "templated, raw, or `suffix` (FIM); `context`; NDJSON"),
    R("POST", "/api/embed", "Ollama", True, "with --embedding; L2-normalised, `dimensions`, `truncate`"),
    R("POST", "/api/embeddings", "Ollama", True, "with --embedding; Ollama's older route"),
    R("GET", "/tools", "llama-server", True, "the built-in tools and the MCP servers' tools", MCP),
    R("POST", "/tools", "llama-server", True, "call one tool (`stream` for exec_shell_command)", MCP),
    R("GET", "/models", "llama-server", True, "the catalogue with each model's status", ROUTER),
    R("GET", "/v1/models", "OpenAI", True, "the catalogue", ROUTER),
    R("GET", "/v1/models/<path:name>", "OpenAI", True, "one catalogue model", ROUTER),
    R("POST", "/models/load", "llama-server", True, "start a model's child server", ROUTER),
    R("POST", "/models/unload", "llama-server", True, "stop a model's child server", ROUTER),
    R("GET", "/models/sse", "llama-server", True, "model status and load-progress events", ROUTER),
    R("POST", "/models", "llama-server", True, "fetches a built-in model (PyPI) into the cache", ROUTER),
    R("DELETE", "/models", "llama-server", True, "removes a built-in model from the cache", ROUTER),
    R("GET", "/api/tags", "Ollama", True, "every catalogue model on this machine, loaded or not", ROUTER),
    R("GET", "/api/ps", "Ollama", True, "the running children; `expires_at` from their keep_alive", ROUTER),
    R("POST", "/api/pull", "Ollama", True, "a built-in model fetched into the cache (PyPI); NDJSON", ROUTER),
    R("DELETE", "/api/delete", "Ollama", True, "removes a built-in or llama.cpp cache model", ROUTER),
    R("POST", "/api/chat", "Ollama", True, "to the named model's child; `keep_alive` unloads it", ROUTER),
)


@dataclass(frozen=True)
class Body:
    """A request body: its routes, whose field list it is, the schema that reads it, and the fields."""

    routes: str
    origin: str
    schema: type[BaseModel]
    fields: tuple[str, ...]


BODIES: tuple[Body, ...] = (
    Body("/completion", "llama-server's README", NativeCompletionRequest, (
        "prompt", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
        "n_predict", "n_indent", "n_keep", "n_cmpl", "n_cache_reuse", "stream", "stop", "typical_p",
        "repeat_penalty", "repeat_last_n", "presence_penalty", "frequency_penalty", "dry_multiplier",
        "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
        "xtc_probability", "xtc_threshold", "mirostat", "mirostat_tau", "mirostat_eta", "grammar",
        "json_schema", "seed", "ignore_eos", "logit_bias", "n_probs", "min_keep", "t_max_predict_ms",
        "id_slot", "cache_prompt", "return_tokens", "samplers", "timings_per_token", "return_progress",
        "sse_ping_interval", "post_sampling_probs", "response_fields", "lora",
    )),
    Body("/infill", "llama-server's README", InfillRequest, (
        "input_prefix", "input_suffix", "input_extra", "prompt",
    )),
    Body("/v1/completions", "OpenAI", OpenAICompletionRequest, (
        "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens",
        "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix", "temperature",
        "top_p", "user",
    )),
    Body("/v1/chat/completions", "OpenAI", ChatCompletionRequest, (
        "messages", "model", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
        "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
        "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
        "prompt_cache_retention", "reasoning_effort",
        "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
        "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
        "verbosity", "web_search_options",
    )),
    Body("/v1/chat/completions", "llama-server's readers beyond OpenAI's fields", ChatCompletionRequest, (
        "n_probs", "response_fields", "return_tokens", "t_max_predict_ms", "n_discard", "n_cache_reuse",
        "sse_ping_interval", "t_max_prompt_ms", "n_keep", "n_indent", "lora", "chat_format", "chat_parser",
        "generation_prompt", "parse_tool_calls", "grammar_type", "grammar_triggers", "preserved_tokens",
    )),
)  # fmt: skip

KEEP_NOTE = (
    "the prompt's first tokens a context shift keeps (-1: all the prompt; one more where the model adds "
    "BOS) and a too-long prompt's cut keeps, as llama-server; absent: --keep"
)
INDENT_NOTE = (
    "a generated line after the first whose indentation (spaces, tabs) is shorter ends the generation "
    "(`stop_type` limit), the text cut where that indentation ends, as llama-server"
)
LORA_NOTE = (
    "this request's LoRA scales ([{id, scale}]; adapters it does not list run at 0), batched per row with "
    "other adapter sets (CPU and CUDA backends; an aLoRA from its invocation in the prompt on); an unknown "
    "id or a scale that is not a number is a 400 (llama-server skips them)"
)
# What a field's status does not say.
FIELD_NOTES: dict[tuple[str, str], str] = {
    ("/v1/completions", "suffix"): "runs as /infill (prompt = prefix); 501 naming the missing FIM tokens "
    "on a model without them (llama-server answers 400 for any `suffix`)",
    ("/v1/completions", "echo"): "the prompt's text before the completion",
    ("/completion", "prompt"): "a list of prompts is answered as a list of replies (whole, not streamed)",
    ("/completion", "n_cmpl"): "several choices are served on /v1/completions and /v1/chat/completions",
    ("/v1/chat/completions", "tools"): "`mcp` tools run the server-side tool loop",
    ("/v1/chat/completions", "n_probs"): "read when `logprobs` is not set: the reply's `logprobs` with this "
    "many `top_logprobs` per token, as llama-server writes them",
    ("/completion", "t_max_predict_ms"): "once this many ms passed since the first token, the next token "
    "whose text holds a newline ends the generation (`stop_type` limit), as llama-server",
    ("/completion", "n_keep"): KEEP_NOTE,
    ("/v1/chat/completions", "n_keep"): KEEP_NOTE,
    ("/completion", "n_indent"): INDENT_NOTE,
    ("/v1/chat/completions", "n_indent"): INDENT_NOTE,
    ("/completion", "return_tokens"): "a whole reply's `tokens` (else `[]`); each streamed chunk carries "
    "its token, as llama-server",
    ("/completion", "lora"): LORA_NOTE,
    ("/v1/chat/completions", "lora"): LORA_NOTE,
}
# llama-server's internal fields: its OpenAI layer sets them from the template; Llamba reads it itself.
INTERNAL = ("chat_format", "chat_parser", "generation_prompt", "parse_tool_calls", "grammar_type")
FIELD_NOTES |= {
    ("/v1/chat/completions", name): "llama-server's internal field (its chat layer sets it from the "
    "template, which Llamba reads itself)"
    for name in INTERNAL
}


def field_status(body: Body, name: str) -> str:
    """What the body's schema does with the field: read it, accept it without effect (metadata, or a
    llama-server field with nothing to change here), take only its no-op value, or ignore it as unknown
    (logged once; a 400 naming it with --strict-fields)."""
    declared = {f.alias or n for n, f in body.schema.model_fields.items()}
    if name in declared:
        return "implemented"
    if name in METADATA:
        return "accepted: metadata, changes no output"
    if name in ACCEPTED:
        return f"accepted, no effect: {ACCEPTED[name]}"
    if name in NOT_YET:
        return f"not implemented: accepted only at `{NOT_YET[name]!r}` (no effect), else 400"
    return UNKNOWN_STATUS


# An unknown field (server/http/unknown_fields.py).
UNKNOWN_STATUS = "unknown: ignored and logged once (400 with --strict-fields)"


# Ollama's API (server/apis/ollama/): what each of its request fields does here, where that is not what
# Ollama does, or is done without effect. docs/compatibility.md's Ollama section is generated from it and
# from the options accepted without effect (server/apis/ollama/options.py's NO_EFFECT).
OLLAMA_NOTES: tuple[tuple[str, str], ...] = (
    ("`model` (every route)", "the server's model under Ollama's naming rules (`smollm2`, `smollm2:latest`, "
     "`library/smollm2`, any case) or any of its -a aliases; another name is Ollama's 404 `model 'x' not "
     "found` (llama-server's OpenAI route ignores `model`: Ollama clients pick from /api/tags and act on the "
     "404); a missing one is Ollama's 400 `model is required`"),
    ("`keep_alive` (every route)", "accepted, no effect: a single-model server cannot unload its model; "
     "`keep_alive: 0` with no prompt answers `done_reason` \"load\" (Ollama: \"unload\"); /api/ps says the "
     "model never expires (a router unloads: server/router)"),
    ("`options` defaults", "the server's sampling flags (llama-server's defaults: top_p 0.95, min_p 0.05), "
     "not Ollama's (top_p 0.9, min_p 0); an unknown option is ignored and logged once, as Ollama warns"),
    ("`options.num_ctx`", "below the slot's context it bounds the request (a prompt of num_ctx tokens or "
     "more is a 400, generation stops at num_ctx with done_reason \"length\"); at or above it, no effect: "
     "the slots' size is -c / -np, fixed at start, which /api/ps reports"),
    ("`options.num_predict: -2`", "as -1: until the slot's context is full"),
    ("`truncate`, `shift` (chat, generate)", "accepted, no effect: a prompt too long for the slot follows "
     "--context-shift (cut and shifted, or a 400), as on the other routes"),
    ("`truncate` (embed)", "implemented: the input cut to the slot's context, or with false a 400"),
    ("`template` (generate)", "400: Go templates are not run; render the prompt and send it with `raw`"),
    ("`images` with `raw` or `suffix` (generate)", "400: images are read through the chat template only"),
    ("`context` (generate)", "implemented: prepended to a templated or FIM prompt as tokens (its BOS not "
     "repeated); the final object's `context` is the prompt's and the answer's tokens (none when raw, as "
     "Ollama, or when the prompt holds images)"),
    ("`tool_choice` (chat)", "Llamba's extension, not Ollama's: the OpenAI route's tool_choice, for a model "
     "that writes its calls only when held to them"),
    ("`think`", "on a template without a thinking block, true or a level is Ollama's 400 `does not support "
     "thinking`; absent on one with a block, the model thinks (Ollama's default); false closes the block "
     "(enable_thinking false, a budget of 0); a level is the template's `reasoning_effort`"),
    ("`logprobs`, `top_logprobs`", "implemented: each token's log probability and the best alternatives"),
    ("`suffix` (generate)", "implemented with the model's FIM tokens in /infill's layout; a model without "
     "them is Ollama's 400 `does not support insert`"),
    ("/api/tags, /api/ps `digest`", "the sha256 of the model file's path, size and modification time, not of "
     "its bytes (Ollama's blob digest): hashing a multi-gigabyte file would take seconds to minutes"),
    ("/api/show", "`model_info` is the GGUF's metadata (arrays over 5 items shown empty, as Ollama without "
     "`verbose`; `verbose` does not list them) with `general.parameter_count`; no `tensors`, `license` "
     "and `parameters` empty, `modelfile` a FROM line; `system`, `template` and `options` of the body have "
     "no effect"),
    ("`GET /`", "the web UI to a client that accepts HTML (a browser, `Accept: */*`); Ollama's `Ollama is "
     "running` to one that sends no Accept header (Go's client) or only other types"),
    ("/api/pull, /api/push, /api/create, /api/copy, /api/delete, /api/blobs", "not served (404): a "
     "single-model server has no model store"),
)  # fmt: skip
