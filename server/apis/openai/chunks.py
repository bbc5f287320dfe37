"""OpenAI's wire shapes of token events: a chat stream's chunks (`ChatChunks`: deltas in the order their
parts came, logprobs, timings, usage, [DONE]), a whole reply's choice, the fields every reply carries,
and the error event that ends a stream. The routes (server/apis/openai/routes.py) and the tool loop's
stream use them alike.
"""

from __future__ import annotations

from typing import Any

from engine.api import TokenEvent
from server.chat.generation import Outcome, has_probs, openai_logprobs
from server.chat.job import ChatJob
from server.chat.schemas import ChatCompletionRequest
from server.http import errors, sse
from server.model.host import ModelHost


def base_fields(model: ModelHost, kind: str, completion_id: str, created: int) -> dict[str, Any]:
    return {
        "id": completion_id,
        "object": kind,
        "created": created,
        "model": model.settings.model_alias,
        "system_fingerprint": model.fingerprint,
    }


def chat_error_event(error: errors.APIError) -> bytes:
    """An error as an OpenAI stream (chat or completions) ends with one: the error event, then [DONE]."""
    return sse.error_event(error.body()) + sse.DONE


def verbose_fields(job: ChatJob, out: Outcome) -> dict[str, Any]:
    return {
        "prompt": job.prompt_text,
        "content": out.text,
        "reasoning_content": out.reasoning,
        "tokens": out.tokens,
    }


def chat_choice(
    model: ModelHost,
    body: ChatCompletionRequest,
    out: Outcome,
    index: int = 0,
    prefix: tuple[str, str] = ("", ""),
) -> dict[str, Any]:
    """The one choice of a whole chat reply: the message (content, reasoning, tool calls), why it ended.
    `prefix`: the (content, reasoning) of a prefilled message the answer continues, which llama-server
    reports joined with the continuation."""
    text, reasoning = prefix[0] + out.text, prefix[1] + out.reasoning
    message: dict[str, Any] = {"role": "assistant", "content": text or (None if out.tool_calls else "")}
    if reasoning:
        message["reasoning_content"] = reasoning
    if out.tool_calls:
        message["tool_calls"] = [call.to_openai() for call in out.tool_calls]
    choice: dict[str, Any] = {"index": index, "finish_reason": out.finish_reason, "message": message}
    if body.probs_count():  # `logprobs`, or llama-server's `n_probs`
        choice["logprobs"] = {"content": openai_logprobs(model.prompts, out.events)}
    return choice


class ChatChunks:
    """A chat stream's SSE chunks: each delta its own chunk, logprobs and timings as the body asks."""

    def __init__(self, model: ModelHost, body: ChatCompletionRequest, head: dict[str, Any]) -> None:
        self.model, self.body, self.head = model, body, head
        self.timings: dict[str, Any] = {}

    def chunk(self, delta: dict[str, Any], finish: str | None = None, index: int = 0, **extra: Any) -> bytes:
        choice = {"index": index, "finish_reason": finish, "delta": delta, **extra}
        return sse.event({**self.head, "choices": [choice], **self.timings})

    def lead(self, content: str, reasoning: str, index: int = 0) -> list[bytes]:
        """The prefilled message's chunks, before the answer's (reasoning first, as it came)."""
        deltas = [{"reasoning_content": reasoning}] if reasoning else []
        return [self.chunk(d, index=index) for d in deltas + ([{"content": content}] if content else [])]

    def event(self, event: TokenEvent, index: int = 0) -> list[bytes]:
        """An engine event's chunks (none for an event that carries nothing to show)."""
        if event.progress is not None:
            timings = {} if event.timings is None else {"timings": event.timings.as_dict()}
            progress = {"prompt_progress": event.progress.as_dict(), **timings}
            return [sse.event({**self.head, "choices": [], **progress})]
        if event.timings is not None and self.body.timings_per_token:
            self.timings = {"timings": event.timings.as_dict()}
        extra = {}
        if self.body.probs_count() and has_probs(event):
            extra["logprobs"] = {"content": openai_logprobs(self.model.prompts, [event])}
        deltas = event_deltas(event)
        out = [self.chunk(delta, index=index) for delta in deltas[:-1]]
        if deltas or extra:  # the logprobs ride on the event's last chunk
            out.append(self.chunk(deltas[-1] if deltas else {}, index=index, **extra))
        return out

    def finish(self, final: TokenEvent | None, index: int = 0, timings: bool = True) -> bytes:
        """A choice's finish chunk, with its timings (unless they go on the usage chunk)."""
        last = {**self.head, "choices": [{"index": index, "finish_reason": final_reason(final), "delta": {}}]}
        return sse.event(last | (final_timings(final) if timings else {}))

    def end(self, final: TokenEvent | None, usage_fields: dict[str, Any], n: int = 1) -> list[bytes]:
        """The finish chunk (`n` choices: theirs came as they finished), the usage chunk if asked for,
        and [DONE]. The timings ride on the last of them, as llama-server's."""
        usage = bool((self.body.stream_options or {}).get("include_usage"))
        out = [self.finish(final, timings=not usage)] if n == 1 else []
        if usage:
            timings = final_timings(final) if n == 1 else {}
            out.append(sse.event({**self.head, "choices": [], "usage": usage_fields, **timings}))
        return [*out, sse.DONE]


def final_timings(final: TokenEvent | None) -> dict[str, Any]:
    return {"timings": final.timings.as_dict()} if final is not None and final.timings is not None else {}


def event_deltas(event: TokenEvent) -> list[dict[str, Any]]:
    """An event's chunks in the order its parts came: reasoning, content, tool-call steps (llama-server's
    order). No delta carries an empty string."""
    deltas: list[dict[str, Any]] = []
    if event.reasoning_text:
        deltas.append({"reasoning_content": event.reasoning_text})
    if event.text:
        deltas.append({"content": event.text})
    if event.tool_calls:
        deltas.append({"tool_calls": [step.to_openai() for step in event.tool_calls]})
    return deltas


def final_reason(event: TokenEvent | None) -> str:
    return (event.finish_reason if event else None) or "stop"
