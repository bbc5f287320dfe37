"""/api/generate: a prompt through the chat template (with `system` and `images`), as it is (`raw`), or
around a `suffix` (fill in the middle, with the model's FIM tokens as /infill lays them out).

`context` (a previous reply's token ids) is prepended to a templated or FIM prompt (its BOS not
repeated), and the final object carries the new `context`: the prompt's tokens and the answer's, unless
the request is raw (Ollama's rule) or the prompt holds media. An empty prompt is Ollama's "load" request.
`template` (a Go template) cannot be run here: a 400 says to render the prompt and send it raw.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from engine.api import GenerationRequest
from server.apis.ollama.generation import nothing, respond, thinking, within_num_ctx
from server.apis.ollama.models import adapter_named
from server.apis.ollama.options import Options, read_options
from server.apis.ollama.replies import Clock, Reply, load_object
from server.apis.ollama.schemas import OllamaGenerateRequest
from server.apis.ollama.translate import completion_request, generate_chat
from server.chat.generation import build_request, new_id
from server.chat.job import prepare_chat
from server.http import errors
from server.model.host import ModelHost


async def generate_reply(model: ModelHost, body: OllamaGenerateRequest, clock: Clock) -> Any:
    name = body.model
    check(body)
    options = read_options(body.options)
    if not body.prompt and not body.images:
        return load_object(name, chat=False)
    thinks = thinking(model, body.think, name)
    if body.raw or body.suffix:
        request = await completion(model, body, options, name)
    else:
        chat = generate_chat(body, options, thinks).model_copy(update={"model": adapter_named(model, name)})
        job = await prepare_chat(model, chat, new_id("ollama"))
        request = with_context(model, job.request, body.context)
    request = within_num_ctx(request, len(request.prompt_tokens), options.num_ctx, model.n_ctx_slot)
    clock.ready()
    reply = Reply(name, chat=False, prompts=model.prompts if body.logprobs else None)
    extra = nothing if body.raw else context_of(model, request)
    return await respond(model, request, reply, clock, body.streams, extra)


def check(body: OllamaGenerateRequest) -> None:
    if body.template:
        raise errors.invalid_request(
            "'template': Go templates are not run by this server; render the prompt and send it with raw"
        )
    if body.raw and (body.system or body.context):
        raise errors.invalid_request("raw mode does not support template, system, or context")
    if (body.raw or body.suffix) and body.images:
        raise errors.invalid_request("images are read through the chat template: not with raw or suffix")


async def completion(
    model: ModelHost, body: OllamaGenerateRequest, options: Options, name: str
) -> GenerationRequest:
    """A raw prompt as it is, or the FIM prompt around `suffix` (the prompt is the code before it)."""
    fields = completion_request(body, options).model_copy(update={"model": adapter_named(model, name)})
    prompts = model.prompts
    if body.suffix:
        if prompts.tokenizer.fim.missing():
            raise errors.invalid_request(f'"{name}" does not support insert')
        tokens = await prompts.infill_prompt(body.prompt, body.suffix, [], "")
    else:
        tokens = await prompts.tokenize_prompt(body.prompt)
    prompt = prompts.fit_prompt(tokens, fields.n_keep)
    request = await build_request(model, fields, prompt, fields.n_probs, new_id("ollama"))
    return request if body.raw else with_context(model, request, body.context)


def with_context(
    model: ModelHost, request: GenerationRequest, context: list[int] | None
) -> GenerationRequest:
    """The request's prompt after a previous reply's tokens (its own BOS dropped)."""
    if not context:
        return request
    prompts = model.prompts
    tokens = request.prompt_tokens
    tok = prompts.tokenizer
    if tok.add_bos and tokens and tokens[0] == tok.bos_id:
        tokens = tokens[1:]
    joined = prompts.check_tokens(list(context)) + tokens
    if len(joined) >= model.n_ctx_slot:
        raise errors.exceed_context(len(joined), model.n_ctx_slot)
    return replace(request, prompt_tokens=joined)


def context_of(model: ModelHost, request: GenerationRequest) -> Any:
    """The final object's `context`: the prompt's tokens then the answer's (end-of-generation tokens
    left out); none for a prompt with media (their positions hold no token)."""
    prompt = list(request.prompt_tokens)
    eog = model.prompts.tokenizer.eog_ids

    def extra(reply: Reply) -> dict[str, Any]:
        if any(t < 0 for t in prompt):
            return {}
        return {"context": prompt + [t for t in reply.tokens if t not in eog]}

    return extra
