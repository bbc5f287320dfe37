"""What the generation routes share: engine requests built from request bodies, their events read
(and counted) on the event loop, and the reply fragments several routes shape alike (usage, logprobs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from engine.api import GenerationRequest, Timings, TokenEvent, ToolCall, add_tool_call_steps
from server import errors
from server.schemas import CompletionRequest, GenerationFields
from server.service import ModelService
from server.structured import ToolPlan, answer_grammar


async def build_request(
    service: ModelService,
    body: GenerationFields,
    prompt_tokens: list[int],
    n_probs: int,
    request_id: str,
    truncated: bool = False,
    tools: ToolPlan | None = None,
) -> GenerationRequest:
    """The engine request of a body: sampling, limits, stop strings, and its grammar (the body's
    constraint, or its tools' calls, which are then also parsed out of the answer)."""
    try:
        sampling = body.sampling(service.default_sampling(), service.model_info().n_vocab, n_probs)
    except ValueError as exc:
        raise errors.invalid_request(str(exc)) from exc
    return GenerationRequest(
        prompt_tokens=prompt_tokens,
        sampling=sampling,
        n_predict=body.max_new_tokens(service.settings.n_predict),
        stop=body.stop_list() + (tools.format.extra_stops if tools else ()),
        ignore_eos=body.ignore_eos,
        id_slot=body.id_slot,
        cache_prompt=body.cache_prompt,
        request_id=request_id,
        timings_per_token=body.timings_per_token,
        return_progress=body.return_progress,
        truncated=truncated,
        tool_calls=tools.parsing if tools else None,
        grammar=await answer_grammar(service, body, tools),
    )


async def completion_request(service: ModelService, raw: Any) -> tuple[CompletionRequest, list[int], bool]:
    """A validated completion body, its prompt tokens fitted to the context, and whether they were cut."""
    body = CompletionRequest.model_validate(raw)
    service.require_ready()
    tokens, truncated = service.fit_prompt(await service.tokenize_prompt(body.prompt))
    return body, tokens, truncated


@dataclass
class Outcome:
    """Everything a finished generation produced, for non-streaming replies."""

    text: str = ""
    reasoning: str = ""  # the reasoning block's text, when the request splits it out
    tool_calls: list[ToolCall] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    events: list[TokenEvent] = field(default_factory=list)
    final: TokenEvent | None = None

    @property
    def finish_reason(self) -> str:
        return (self.final.finish_reason if self.final else None) or "stop"

    @property
    def timings(self) -> Timings | None:
        return self.final.timings if self.final else None

    @property
    def n_generated(self) -> int:
        return self.final.timings.predicted_n if self.final and self.final.timings else len(self.tokens)

    def add(self, event: TokenEvent) -> None:
        self.text += event.text
        self.reasoning += event.reasoning_text
        add_tool_call_steps(self.tool_calls, event.tool_calls)
        if event.token is not None:
            self.tokens.append(event.token)
            self.events.append(event)
        if event.finish_reason is not None:
            self.final = event


@dataclass(frozen=True)
class ChatJob:
    """A validated chat request made ready for the engine: its prompt, and the engine request."""

    prompt_text: str
    n_prompt: int
    request: GenerationRequest


async def events_of(service: ModelService, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
    """The request's events; if the consumer goes away (client disconnect) the generation is cancelled."""
    handle = service.submit(request)
    try:
        async for event in handle:
            if event.finish_reason is not None:
                service.counters.record(event)
            yield event
    finally:
        handle.cancel()


async def collect(service: ModelService, request: GenerationRequest) -> Outcome:
    out = Outcome()
    async for event in events_of(service, request):
        out.add(event)
    return out


def usage(n_prompt: int, outcome_final: TokenEvent | None) -> dict[str, Any]:
    t = outcome_final.timings if outcome_final else None
    completion = t.predicted_n if t else 0
    return {
        "completion_tokens": completion,
        "prompt_tokens": n_prompt,
        "total_tokens": n_prompt + completion,
        "prompt_tokens_details": {"cached_tokens": t.cache_n if t else 0},
    }


def piece_info(service: ModelService, token: int, logprob: float) -> dict[str, Any]:
    raw = service.piece(token)
    return {
        "id": token,
        "token": raw.decode("utf-8", errors="replace"),
        "bytes": list(raw),
        "logprob": logprob,
    }


def openai_logprobs(service: ModelService, events: list[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI's logprobs.content entries (llama-server adds the token id)."""
    content = []
    for ev in events:
        if ev.token is None or ev.logprob is None:
            continue
        entry = piece_info(service, ev.token, ev.logprob)
        entry["top_logprobs"] = [piece_info(service, t, lp) for t, lp in ev.top_logprobs]
        content.append(entry)
    return content


def stop_type(event: TokenEvent | None) -> str:
    """llama-server's stop_type: eos, word, limit or none."""
    if event is None or event.finish_reason in (None, "cancelled", "error"):
        return "none"
    if event.stop_word is not None:
        return "word"
    return "eos" if event.finish_reason == "stop" else "limit"
