"""llama-server's native routes: /health /props /completion /infill /tokenize /detokenize
/apply-template /lora-adapters."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from quart import Blueprint

from engine.api import GenerationRequest, ReasoningTags
from server.agents.toolbox import Toolbox
from server.apis.native.completion import (
    NativeCompletionRequest,
    answer_all,
    native_final,
    native_partial,
    partial_timings,
    sub_prompt,
)
from server.chat.generation import build_request, collect, new_id, openai_logprobs, raise_if_failed
from server.chat.job import chat_tokens, template_kwargs
from server.chat.media import MEDIA_MARKER
from server.chat.schemas import (
    ApplyTemplateRequest,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    InfillRequest,
    TokenizeRequest,
)
from server.chat.task_params import RunParams, task_params
from server.http import errors, sse
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.model.lora import LoraRequestError
from server.model.prompts import ChatInput, Prompt
from server.state import app_state

bp = Blueprint("native", __name__)


@bp.get("/health")
@bp.get("/v1/health")
async def health() -> Any:
    model = current_model()
    if model.load_error:
        raise errors.APIError(500, f"model failed to load: {model.load_error}", "server_error")
    if not model.ready:  # a sleeping model is healthy: it wakes on the next request
        raise errors.unavailable()
    return {"status": "ok"}


@bp.post("/props")
async def change_props() -> Any:
    """llama-server's POST /props (with --props): it changes no property yet, so the only body it takes
    is an empty object; a property named is a 400 rather than silently kept as it is."""
    if not current_model().settings.props:
        raise errors.not_supported(
            "This server does not support changing global properties. Start it with `--props`"
        )
    body = await json_body()
    if not isinstance(body, dict):
        raise errors.invalid_request("the body must be a JSON object")
    if body:
        raise errors.invalid_request(f"no property can be changed at run time (asked: {sorted(body)})")
    return {"success": True}


@bp.get("/lora-adapters")
async def lora_adapters() -> Any:
    """llama-server's list of the loaded LoRA adapters with their global scales."""
    return current_model().lora.listing()


@bp.post("/lora-adapters")
async def set_lora_adapters() -> Any:
    """llama-server's POST /lora-adapters: [{id, scale}] sets the global scales (unlisted ones to 0)."""
    body = await json_body()
    if not isinstance(body, list):
        raise errors.invalid_request("Request body must be an array")
    try:
        current_model().lora.set_global(body)
    except LoraRequestError as exc:
        raise errors.invalid_request(str(exc)) from None
    return {"success": True}


@bp.get("/props")
async def props() -> Any:
    """llama-server's /props, every key it writes (its get_res_props), then Llamba's own: the backend,
    the web UI switch, whether `/tools` is served (`--tools` or MCP servers: the web UI asks it only
    then), the reasoning settings and the tool loop."""
    model = current_model()
    info = model.model_info()
    s = model.settings
    return {
        "default_generation_settings": {"id": 0, "params": default_params(model), "n_ctx": model.n_ctx_slot},
        "total_slots": model.n_slots,
        "model_alias": s.model_alias,
        "model_ftype": info.ftype,
        "model_path": str(info.path),
        "modalities": {
            m: k in model.modalities for m, k in (("vision", "image"), ("video", "video"), ("audio", "audio"))
        },
        "media_marker": MEDIA_MARKER,
        "endpoint_slots": s.slots,
        "endpoint_props": s.props,
        "endpoint_metrics": s.metrics,
        "ui": s.webui,
        "ui_settings": s.ui_settings,
        "chat_template": model.template_source(),
        "chat_template_caps": model.template_caps(),
        "bos_token": info.bos_token,
        "eos_token": info.eos_token,
        "build_info": "llamba",
        "is_sleeping": model.sleeping,
        "cors_proxy_enabled": s.ui_mcp_proxy,
        "backend": info.backend,
        "webui": s.webui,
        "endpoint_tools": app_state().toolbox is not None,
        "reasoning": reasoning_props(model),
        "tool_loop": tool_loop_props(model),
    }


def default_params(model: ModelHost) -> dict[str, Any]:
    """`default_generation_settings.params`: llama-server's default task params over the server's
    sampling (as it writes them: n_keep 0, no stream, reasoning_format none, no speculation), with -n as
    the token limit where llama-server writes -1 whatever -n says (the web UI's max-tokens default);
    then Llamba's: the DRY breakers, the logit bias (a ban as false) and the reasoning budget."""
    s = model.settings
    params = s.sampling
    return task_params(params, RunParams(n_predict=s.n_predict)) | {
        "dry_sequence_breakers": list(params.dry_sequence_breakers),
        "logit_bias": [[t, b if b != float("-inf") else False] for t, b in params.logit_bias.items()],
        "reasoning_budget_tokens": s.reasoning_budget,
    }


def tool_loop_props(model: ModelHost) -> dict[str, Any]:
    """The server-side tool loop: its limits, and the MCP servers a request can name (`server_label`);
    a server is available once it started and listed its tools (`ready`: the start-up warm-up is over)."""
    s = model.settings
    mcp: Toolbox | None = app_state().toolbox
    servers = [
        {"server_label": name, "available": bool(tools), "tools": [t.tool for t in tools]}
        for name in (mcp.server_names() if mcp else [])
        for tools in [mcp.server_tools(name)]  # type: ignore[union-attr]
    ]
    return {
        "ready": mcp.ready if mcp else True,
        "mcp_servers": servers,
        "max_rounds": s.tool_max_rounds,
        "tool_timeout": s.tool_timeout,
        "max_tokens": s.tool_max_tokens,
    }


def reasoning_props(model: ModelHost) -> dict[str, Any]:
    """The reasoning settings and what the template says about thinking (its tags, if it has a block)."""
    s = model.settings
    found = model.reasoning_tags()
    tags = found or ReasoningTags()
    return {
        "format": s.reasoning_format,
        "mode": s.reasoning,
        "budget": s.reasoning_budget,
        "budget_message": s.reasoning_budget_message,
        "template_has_thinking": found is not None,
        "start_tag": tags.start,
        "end_tags": list(tags.ends),
    }


# -- native completion -----------------------------------------------------------------------------
@bp.post("/completion")
@bp.post("/completions")
async def completion() -> Any:
    model = current_model()
    body = NativeCompletionRequest.model_validate(await json_body())
    if body.n_choices() > 1:
        raise errors.invalid_request(
            "'n': several choices are served on /v1/completions and /v1/chat/completions"
        )
    model.require_ready()  # 503 while the model loads
    prompts = [await sub_prompt(model, p, body.n_keep) for p in body.sub_prompts()]
    if len(prompts) == 1:
        return await native_reply(model, body, prompts[0])
    return await answer_all(body, [native_reply(model, body, p, i) for i, p in enumerate(prompts)])


@bp.post("/infill")
async def infill() -> Any:
    """llama-server's /infill: the model's FIM prompt around the code, then /completion's reply."""
    model = current_model()
    body = InfillRequest.model_validate(await json_body())
    prompts = model.prompts  # 503 while the model loads
    extra = [(chunk.filename, chunk.text) for chunk in body.input_extra]
    tokens = await prompts.infill_prompt(body.input_prefix, body.input_suffix, extra, body.prompt)
    prompt = prompts.fit_prompt(tokens, body.n_keep)
    if body.n_choices() > 1:
        raise errors.invalid_request("'n': several choices are served on /v1/completions")
    return await native_reply(model, body, prompt)


async def native_reply(model: ModelHost, body: CompletionRequest, prompt: Prompt, index: int = 0) -> Any:
    """/completion's and /infill's reply: streamed, or whole (`response_fields` keeps some of it)."""
    n_probs = body.n_probs or body.logprobs or 0  # llama-server reads `logprobs` without `n_probs`
    gen = await build_request(model, body, prompt, n_probs, new_id("cmpl"))
    if body.stream:
        return sse.response(native_stream(model, body, gen))
    out = await collect(model.client, gen)
    return native_final(model, body, gen, out.final, index, whole=out)


async def native_stream(
    model: ModelHost, body: CompletionRequest, gen: GenerationRequest
) -> AsyncIterator[bytes]:
    """llama-server's stream: a partial result per prompt-progress update and per token (the last
    token's too), then the final result without text (it went out token by token)."""
    n_prompt, has_new_line = len(gen.prompt_tokens), False
    async for event in model.client.events(gen):
        raise_if_failed(event)
        has_new_line = has_new_line or "\n" in event.text
        if event.finish_reason is None or event.token is not None:
            probs = openai_logprobs(model.prompts, [event]) if gen.sampling.n_probs else None
            timings = partial_timings(event, body.timings_per_token)
            yield sse.event(native_partial(event, n_prompt, timings=timings, probs=probs))
        if event.finish_reason is not None:
            yield sse.event(native_final(model, body, gen, event, has_new_line=has_new_line))


# -- tokens and templates --------------------------------------------------------------------------
@bp.post("/tokenize")
async def tokenize() -> Any:
    """llama-server's /tokenize of `content`; or, with `messages` (and any chat field: tools,
    chat_template_kwargs, ...), the prompt tokens that chat request would run with, counted as
    /v1/chat/completions counts its prompt_tokens."""
    model = current_model()
    raw = await json_body()
    if isinstance(raw, dict) and "messages" in raw:
        if "content" in raw:  # two answers asked for: which one the client meant is a guess
            raise errors.invalid_request("'content': give 'content' or 'messages', not both")
        with_pieces = bool(raw.pop("with_pieces", False))
        tokens = await chat_tokens(model, ChatCompletionRequest.model_validate(raw))
    else:
        body = TokenizeRequest.model_validate(raw)
        tokens = await model.prompts.tokenize(body.content, body.add_special, body.parse_special)
        with_pieces = body.with_pieces
    if not with_pieces:
        return {"tokens": tokens}
    return {"tokens": [{"id": t, "piece": text_or_bytes(model.prompts.piece(t))} for t in tokens]}


def text_or_bytes(raw: bytes) -> str | list[int]:
    """A token's piece as llama-server shows it: text when it is valid UTF-8, else its byte values."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


@bp.post("/detokenize")
async def detokenize() -> Any:
    model = current_model()
    body = DetokenizeRequest.model_validate(await json_body())
    return {"content": model.prompts.detokenize(body.tokens)}


@bp.post("/apply-template")
async def apply_template() -> Any:
    model = current_model()
    body = ApplyTemplateRequest.model_validate(await json_body())
    prompts = model.prompts  # 503 while the model loads
    tools = body.shown_tools(prompts.describes_tools)
    chat = ChatInput(
        [m.model_dump(exclude_none=True) for m in body.messages],
        tools,
        prompts.tool_format if tools else None,
        continue_final_message=body.continue_final_message,
        add_generation_prompt=body.add_generation_prompt is not False,
        template_kwargs=template_kwargs(model.settings, body.reasoning_effort, body.chat_template_kwargs),
    )
    return {"prompt": prompts.render_chat(chat)}
