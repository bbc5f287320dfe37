"""llama-server's native /completion: its prompt forms, one reply per prompt, and the reply's fields.

A `prompt` is a string, a token array, a mixed array of tokens and strings (one prompt), an object with
`prompt_string` (and `multimodal_data`, refused here: no multimodal model), or an array of those: each
element its own generation, run side by side and answered as a list in the prompts' order (llama-server's
`tokenize_input_prompts`). The reply carries the request's `generation_settings` and the prompt's text;
`response_fields` keeps only the listed paths (`a/b` reads nested keys), each under its path.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import fields
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, field_validator

from engine.api import GenerationRequest
from server.chat.schemas import CompletionRequest
from server.http import errors
from server.model.host import ModelHost
from server.model.prompts import PromptBuilder

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

    def sub_prompts(self) -> list[SubPrompt]:
        """The prompts to answer: an array without tokens holds several, anything else is one."""
        p = self.prompt
        if isinstance(p, list) and not any(isinstance(e, int) for e in p):
            if not p:
                raise errors.invalid_request('"prompt" must not be empty')
            return list(p)  # type: ignore[arg-type]
        return [p]  # type: ignore[list-item]


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


def generation_settings(model: ModelHost, body: CompletionRequest, gen: GenerationRequest) -> dict[str, Any]:
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
