"""llama-server's native /completion: its prompt forms, one reply per prompt, and the reply's fields.

A `prompt` is a string, a token array, a mixed array of tokens and strings (one prompt), an object with
`prompt_string` (and `multimodal_data`: base64 media for a model with --mmproj), or an array of those: each
element its own generation, run side by side and answered as a list in the prompts' order (llama-server's
`tokenize_input_prompts`). The reply carries the request's `generation_settings` and the prompt's text;
`response_fields` keeps only the listed paths (`a/b` reads nested keys), each under its path.

The reply's shapes are llama-server's (server-task.cpp): `native_partial` is a partial result's
to_json_non_oaicompat (a token, or a prompt-progress update), `native_final` the final result's. The
OpenAI routes put the same objects under `__verbose` (`verbose`, or the server's -v).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, field_validator

from engine.api import GenerationRequest, TokenEvent
from server.chat.generation import Outcome, openai_logprobs, stop_type
from server.chat.media import MEDIA_MARKER, load_media
from server.chat.schemas import CompletionRequest, GenerationFields
from server.http import errors
from server.model.host import ModelHost
from server.model.media import MediaPrompt, media_tokens, sniff_kind
from server.model.prompts import Prompt, PromptBuilder

Mixed = list[StrictInt | StrictStr]


class PromptObject(BaseModel):
    """A prompt given as llama-server's JSON object: its text (or mixed tokens), and media."""

    model_config = ConfigDict(extra="forbid")

    prompt_string: StrictStr | Mixed
    multimodal_data: list[StrictStr] | StrictStr | None = None


SubPrompt = StrictStr | Mixed | PromptObject


class NativeCompletionRequest(CompletionRequest):
    """/completion's body: /v1/completions' fields with llama-server's prompt forms and
    `response_fields`."""

    prompt: StrictStr | PromptObject | list[StrictInt | StrictStr | Mixed | PromptObject] = ""  # type: ignore[assignment]
    response_fields: list[StrictStr] | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: Any) -> Any:  # several prompts are answered here: nothing to narrow
        return v

    @field_validator("response_fields", mode="before")
    @classmethod
    def _paths_or_none(cls, v: Any) -> Any:
        """Anything but a list of paths is no filter, as llama-server reads it (a 200 with the whole
        reply, not a 400)."""
        return v if isinstance(v, list) and all(isinstance(p, str) for p in v) else None

    def sub_prompts(self) -> list[SubPrompt]:
        """The prompts to answer: an array without tokens holds several, anything else is one."""
        p = self.prompt
        if isinstance(p, list) and not any(isinstance(e, int) for e in p):
            if not p:
                raise errors.invalid_request('"prompt" must not be empty')
            return list(p)  # type: ignore[arg-type]
        return [p]  # type: ignore[list-item]


async def sub_prompt(model: ModelHost, prompt: SubPrompt, n_keep: int | None) -> Prompt:
    """One prompt as it will run; with `multimodal_data`, its media encoded and placed at the media
    marker (/props' media_marker) as mtmd places them."""
    builder = model.prompts
    if not isinstance(prompt, PromptObject) or not prompt.multimodal_data:
        return builder.fit_prompt(await prompt_tokens(builder, prompt), n_keep)
    encoder = model.media
    if encoder is None:
        raise errors.invalid_request(
            "Multimodal data provided, but model does not support multimodal requests."
        )
    if not isinstance(prompt.prompt_string, str):
        raise errors.invalid_request("'prompt_string' must be a string when 'multimodal_data' is given")
    data = [prompt.multimodal_data] if isinstance(prompt.multimodal_data, str) else prompt.multimodal_data
    files = [load_media(item, None) for item in data]
    media = MediaPrompt(MEDIA_MARKER, [await encoder.medium(sniff_kind(f), f) for f in files])
    tokens = await media_tokens(builder.tokenize, builder.tokenizer, prompt.prompt_string, media)
    return builder.fit_prompt(tokens, n_keep, {c.marker: c for c in media.chunks})


async def prompt_tokens(builder: PromptBuilder, prompt: SubPrompt) -> list[int]:
    """One prompt's tokens: a string as /completion tokenizes it (BOS per the model), tokens as given,
    and a mixed array piece by piece (BOS only when it starts with a string, as llama-server)."""
    if isinstance(prompt, PromptObject):
        if prompt.multimodal_data:
            raise errors.invalid_request(
                "Multimodal data provided, but model does not support multimodal requests."
            )
        return await prompt_tokens(builder, prompt.prompt_string)
    if isinstance(prompt, str):
        return await builder.tokenize_prompt(prompt)
    tokens: list[int] = []
    for i, piece in enumerate(prompt):
        if isinstance(piece, int):
            tokens += builder.check_tokens([piece])
        elif i == 0:
            tokens += await builder.tokenize_prompt(piece)
        else:
            tokens += await builder.tokenize(piece, False, True)
    return tokens


async def answer_all(body: NativeCompletionRequest, replies: list[Any]) -> list[Any]:
    """Several prompts' replies (awaitables), generated side by side, in the prompts' order."""
    if body.stream:
        raise errors.invalid_request("'stream': several prompts are answered whole (stream one prompt)")
    return list(await asyncio.gather(*replies))


def generation_settings(model: ModelHost, body: GenerationFields, gen: GenerationRequest) -> dict[str, Any]:
    """llama-server's `generation_settings`: the sampling the request ran with and its limits; with
    ignore_eos the end-of-generation tokens are banned through logit_bias, as there."""
    p = gen.sampling
    skip = ("logit_bias", "samplers", "dry_sequence_breakers")
    settings: dict[str, Any] = {f.name: getattr(p, f.name) for f in fields(p) if f.name not in skip}
    bias = dict(p.logit_bias)
    if gen.ignore_eos:
        bias |= dict.fromkeys(sorted(model.prompts.tokenizer.eog_ids), -math.inf)
    return settings | {
        "samplers": list(p.samplers),
        "dry_sequence_breakers": list(p.dry_sequence_breakers),
        "logit_bias": [{"bias": b if math.isfinite(b) else None, "token": t} for t, b in bias.items()],
        "n_predict": gen.n_predict,
        "max_tokens": gen.n_predict,
        "stop": list(gen.stop),
        "ignore_eos": gen.ignore_eos,
        "stream": body.stream,
        "n_keep": model.settings.keep,
        "timings_per_token": gen.timings_per_token,
    }


def nested_fields(paths: list[str], reply: dict[str, Any]) -> dict[str, Any]:
    """`response_fields`: each path that exists in the reply, under its own name (`a/b` is reply[a][b])."""
    kept: dict[str, Any] = {}
    for path in paths:
        value: Any = reply
        for key in path.split("/"):
            if not isinstance(value, dict) or key not in value:
                break
            value = value[key]
        else:
            kept[path] = value
    return kept


def response_fields(body: GenerationFields) -> list[str] | None:
    """The body's `response_fields` (llama-server reads it on every route: the OpenAI ones apply it to
    `__verbose`); only a list of strings names fields."""
    paths = getattr(body, "response_fields", None)
    if paths is None:
        paths = (body.model_extra or {}).get("response_fields")
    if isinstance(paths, list) and all(isinstance(p, str) for p in paths):
        return paths
    return None


def native_partial(
    event: TokenEvent, n_prompt: int, index: int = 0, timings: bool = True, probs: list[Any] | None = None
) -> dict[str, Any]:
    """A partial result as llama-server writes it: a token (its text and id), or a prompt-progress update
    (no text, no token). `timings`: whether the event's timings go on it (the last token's carry them
    only under timings_per_token or when a stop word ended the generation, as there)."""
    part: dict[str, Any] = {
        "index": index,
        "content": event.text,
        "tokens": [] if event.token is None else [event.token],
        "stop": False,
        "id_slot": event.id_slot,
        "tokens_predicted": event.n_generated,
        "tokens_evaluated": n_prompt,
    }
    if timings and event.timings is not None:
        part["timings"] = event.timings.as_dict()
    if event.progress is not None:
        part["prompt_progress"] = event.progress.as_dict()
    if probs:
        part["completion_probabilities"] = probs
    return part


def partial_timings(event: TokenEvent, timings_per_token: bool) -> bool:
    """Whether a token's partial result carries timings: every one under timings_per_token; else only
    the last, and only when a stop word ended it (llama-server has set its stop by then; an end of
    generation or the token limit is found after the partial went out)."""
    return event.finish_reason is None or timings_per_token or event.stop_word is not None


def native_final(
    model: ModelHost,
    body: GenerationFields,
    gen: GenerationRequest,
    final: TokenEvent | None,
    index: int = 0,
    whole: Outcome | None = None,
    has_new_line: bool = False,
    content: str | None = None,
) -> dict[str, Any]:
    """The final result as llama-server writes it (to_json_non_oaicompat), `response_fields` applied.
    `whole`: the generation of a whole reply (its text, its tokens when `return_tokens` asks, its
    probabilities); a stream's final result has none (they went out in the partial results).
    `content`: the text the model wrote, where the reply's own text is parsed out of it (a chat)."""
    t = final.timings if final else None
    text = (whole.text if whole else "") if content is None else content
    reply: dict[str, Any] = {
        "index": index,
        "content": text,
        "tokens": whole.tokens if whole and getattr(body, "return_tokens", False) else [],
        "id_slot": final.id_slot if final else -1,
        "stop": True,
        "model": model.settings.model_alias,
        "tokens_predicted": t.predicted_n if t else 0,
        "tokens_evaluated": len(gen.prompt_tokens),
        "generation_settings": generation_settings(model, body, gen),
        # a medium's positions hold negative marker ids (engine.api's MediaChunk): no text of theirs
        "prompt": model.prompts.detokenize([t for t in gen.prompt_tokens if t >= 0]),
        "has_new_line": "\n" in text if whole else has_new_line,
        "truncated": final.truncated if final else False,
        "stop_type": stop_type(final),
        "stopping_word": (final.stop_word or "") if final else "",
        "tokens_cached": final.n_cells if final else 0,  # the slot's cells, as llama-server counts them
        "timings": t.as_dict() if t else {},
    }
    if whole and gen.sampling.n_probs:
        probs = openai_logprobs(model.prompts, whole.events)
        if probs:
            reply["completion_probabilities"] = probs
    paths = response_fields(body)
    return nested_fields(paths, reply) if paths else reply
