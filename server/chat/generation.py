"""What the generation routes share: engine requests built from request bodies, their events read
(and counted) on the event loop, and the reply fragments several routes shape alike (usage, logprobs)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

from engine.api import GenerationRequest, Timings, TokenEvent, ToolCall, add_tool_call_steps
from engine.speculative import SPEC_TYPES, SpecParams
from server.chat.schemas import CompletionRequest, GenerationFields
from server.chat.structured import ToolPlan, answer_grammar
from server.http import errors
from server.model.service import ModelService


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
    constraint, or its tools' calls, which are then also parsed out of the answer). A full queue is a
    503 here (--max-queue), before any byte of the reply."""
    service.check_queue(body.n_choices())
    try:
        n_vocab = service.model_info().n_vocab
        sampling = body.sampling(service.default_sampling(), n_vocab, service.encode_plain, n_probs)
    except ValueError as exc:
        raise errors.invalid_request(str(exc)) from exc
    return GenerationRequest(
        prompt_tokens=prompt_tokens,
        sampling=sampling,
        n_predict=body.max_new_tokens(service.settings.n_predict),
        stop=(body.stop_list() or service.settings.reverse_prompts)
        + (tools.format.extra_stops if tools else ()),
        ignore_eos=service.settings.ignore_eos if body.ignore_eos is None else body.ignore_eos,
        id_slot=body.id_slot,
        cache_prompt=body.cache_prompt,
        request_id=request_id,
        timings_per_token=body.timings_per_token,
        return_progress=body.return_progress,
        truncated=truncated,
        tool_calls=tools.parsing if tools else None,
        grammar=await answer_grammar(service, body, tools),
        speculative=spec_params(service, body),
    )


def spec_params(service: ModelService, body: GenerationFields) -> SpecParams | None:
    """The request's speculation: its `speculative.*` fields over the server's --spec-* settings."""
    base = service.settings.spec
    types = _spec_types(body.speculative_type, base.types, bool(service.settings.model_draft))
    asked = {
        "n_max": body.speculative_n_max,
        "n_min": body.speculative_n_min,
        "p_min": body.speculative_p_min,
    }
    try:  # checked even when nothing speculates: a bad value is never silently ignored
        params = replace(base, types=types, **{k: v for k, v in asked.items() if v is not None})
    except ValueError as exc:
        raise errors.invalid_request(f"'speculative': {exc}") from None
    return params if params.enabled else None


def _spec_types(asked: str | list[str] | None, default: tuple[str, ...], has_draft: bool) -> tuple[str, ...]:
    """`speculative.type` (a name, a comma list or a list; "none" turns it off) or the server's types."""
    if asked is None:
        return default
    names = tuple(t.strip() for t in (asked.split(",") if isinstance(asked, str) else asked))
    for name in names:
        if name != "none" and name not in SPEC_TYPES:
            known = ", ".join(SPEC_TYPES)
            raise errors.invalid_request(f"'speculative.type': unknown type {name!r} (known: none, {known})")
        if name == "draft-simple" and not has_draft:
            raise errors.invalid_request("'speculative.type': draft-simple needs a draft model (-md)")
    return () if "none" in names else names


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
        raise_if_failed(event)
        self.text += event.text
        self.reasoning += event.reasoning_text
        add_tool_call_steps(self.tool_calls, event.tool_calls)
        if event.token is not None:
            self.tokens.append(event.token)
            self.events.append(event)
        if event.finish_reason is not None:
            self.final = event


def raise_if_failed(event: TokenEvent) -> None:
    """A request the engine ended with an error (a failed step) is a 500 naming the failure; in a stream
    that already sent bytes, `sse.errors_as_events` turns it into the closing error event."""
    if event.finish_reason == "error":
        raise errors.APIError(500, event.error or "the engine failed while generating", "server_error")


def replayable(request: GenerationRequest) -> bool:
    """Whether the request decodes the same tokens when run again (a resumed durable stream): greedy,
    or seeded sampling; the kernels' batch invariance does the rest."""
    return request.sampling.greedy or not request.sampling.random_seed


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


def piece_info(service: ModelService, token: int, value: float, key: str = "logprob") -> dict[str, Any]:
    raw = service.piece(token)
    return {
        "id": token,
        "token": raw.decode("utf-8", errors="replace"),
        "bytes": list(raw),
        key: value,
    }


def has_probs(event: TokenEvent) -> bool:
    return event.token is not None and (event.logprob is not None or event.prob is not None)


def openai_logprobs(service: ModelService, events: list[TokenEvent]) -> list[dict[str, Any]]:
    """OpenAI's logprobs.content entries (llama-server adds the token id). With post_sampling_probs,
    llama-server's other shape: `prob` and `top_probs` (probabilities after the sampler chain)."""
    content = []
    for ev in events:
        if not has_probs(ev):
            continue
        assert ev.token is not None
        if ev.prob is not None:
            entry = piece_info(service, ev.token, ev.prob, "prob")
            entry["top_probs"] = [piece_info(service, t, q, "prob") for t, q in ev.top_probs]
        else:
            entry = piece_info(service, ev.token, ev.logprob or 0.0)
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
