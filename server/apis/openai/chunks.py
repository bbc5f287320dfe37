"""OpenAI's wire shapes of token events: a chat stream's chunks (`ChatChunks`: deltas in the order their
parts came, logprobs, timings, prompt progress, usage, [DONE]), a whole reply's choice, the fields every
reply carries, `__verbose` (llama-server's: /completion's result, server/apis/native/completion.py) and
the error event that ends a stream. The routes (server/apis/openai/routes.py) and the tool loop's stream
use them alike.
"""

from __future__ import annotations

from typing import Any

from engine.api import GenerationRequest, TokenEvent
from server.apis.native.completion import native_final
from server.chat.generation import Outcome, has_probs, openai_logprobs
from server.chat.schemas import ChatCompletionRequest, GenerationFields
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


def wants_verbose(model: ModelHost, body: GenerationFields) -> bool:
    """`__verbose` in the reply: the body's `verbose`, else the server's -v (llama-server's rule)."""
    return bool(model.settings.verbose if body.verbose is None else body.verbose)


def chat_verbose(model: ModelHost, body: ChatCompletionRequest, gen: GenerationRequest, out: Outcome) -> Any:
    """A whole chat's `__verbose`: /completion's reply for its generation (llama-server's
    to_json_non_oaicompat), whose `content` is the text the model wrote (reasoning and tool calls in it)."""
    return native_final(model, body, gen, out.final, whole=out, content=written_text(model, out))


def written_text(model: ModelHost, out: Outcome) -> str:
    """The text the model wrote: the answer, unless reasoning or tool calls were read out of it; then its
    tokens' text (the end-of-generation token's none), cut at the stop word as llama-server cuts it."""
    if not out.reasoning and not out.tool_calls:
        return out.text
    eog = model.prompts.tokenizer.eog_ids
    text = model.prompts.detokenize([t for t in out.tokens if t not in eog])
    stop_word = out.final.stop_word if out.final else None
    return text[: text.rfind(stop_word)] if stop_word and stop_word in text else text


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
    """A chat stream's SSE chunks: each delta its own chunk, logprobs and timings as the body asks.

    A choice opens with the assistant's role delta (then a prefilled message's chunks, `lead`) before its
    first token's chunks, as llama-server sends it with the first token; a prompt-progress update is a
    chunk of its own, the role delta with `prompt_progress` (and `timings`), as llama-server's (the
    first one also sends the prefilled message, `prompt_progress` on its last chunk)."""

    def __init__(
        self,
        model: ModelHost,
        body: ChatCompletionRequest,
        head: dict[str, Any],
        lead: tuple[str, str] = ("", ""),
    ) -> None:
        self.model, self.body, self.head, self.lead = model, body, head, lead
        self.opened: set[int] = set()  # the choices whose role chunk went out with their first token
        self.led: set[int] = set()  # the choices whose prefilled message went out
        self.new_line: set[int] = set()  # the choices whose text has had a newline (`__verbose`)

    def chunk(
        self,
        delta: dict[str, Any],
        finish: str | None = None,
        index: int = 0,
        top: dict[str, Any] | None = None,
        **extra: Any,
    ) -> bytes:
        """One chunk: the choice's delta (`extra`: more of the choice's fields), `top`: the chunk's own
        fields after the choices (timings, prompt_progress, __verbose)."""
        choice = {"index": index, "finish_reason": finish, "delta": delta, **extra}
        return sse.event({**self.head, "choices": [choice], **(top or {})})

    def open(self, index: int = 0) -> list[bytes]:
        """The choice's role chunk and the prefilled message's chunks (unless a prompt-progress chunk
        sent them), once."""
        if index in self.opened:
            return []
        self.opened.add(index)
        return [self.chunk(delta, index=index) for delta in [ROLE, *self.lead_deltas(index)]]

    def lead_deltas(self, index: int) -> list[dict[str, Any]]:
        """The prefilled message's deltas (reasoning first, as it came), the first time they are asked
        for."""
        if index in self.led:
            return []
        self.led.add(index)
        content, reasoning = self.lead
        deltas = [{"reasoning_content": reasoning}] if reasoning else []
        return deltas + ([{"content": content}] if content else [])

    def reopen(self) -> None:
        """A new round of a tool loop: its own role chunk (no prefill), its own text."""
        self.opened.clear()
        self.new_line.clear()
        self.lead = ("", "")

    def event(self, event: TokenEvent, index: int = 0) -> list[bytes]:
        """An engine event's chunks (none for an event that carries nothing to show)."""
        if event.progress is not None:
            timings = {} if event.timings is None else {"timings": event.timings.as_dict()}
            top = {**timings, "prompt_progress": event.progress.as_dict()}
            deltas = [ROLE, *self.lead_deltas(index)]
            last = self.chunk(deltas[-1], index=index, top=top)
            return [*(self.chunk(delta, index=index) for delta in deltas[:-1]), last]
        out = self.open(index)
        if "\n" in event.text or "\n" in event.reasoning_text:
            self.new_line.add(index)
        extra = {}
        if self.body.probs_count() and has_probs(event):
            extra["logprobs"] = {"content": openai_logprobs(self.model.prompts, [event])}
        deltas = event_deltas(event)
        out += [self.chunk(delta, index=index) for delta in deltas[:-1]]
        if deltas or extra:  # the logprobs and the timings ride on the event's last chunk
            top = None
            if event.timings is not None and self.body.timings_per_token:
                top = {"timings": event.timings.as_dict()}
            out.append(self.chunk(deltas[-1] if deltas else {}, index=index, top=top, **extra))
        return out

    def verbose(self, gen: GenerationRequest | None, final: TokenEvent | None, index: int = 0) -> Any:
        """A streamed choice's `__verbose` (on its finish chunk, as llama-server's): /completion's final
        result, its text and tokens already sent; None when not asked for."""
        if gen is None or not wants_verbose(self.model, self.body):
            return None
        return native_final(self.model, self.body, gen, final, index, has_new_line=index in self.new_line)

    def finish(
        self,
        final: TokenEvent | None,
        index: int = 0,
        timings: bool = True,
        verbose: Any = None,
        fields: dict[str, Any] | None = None,
    ) -> list[bytes]:
        """A choice's finish chunk (after its role chunk, if no token opened it), with its timings (unless
        they go on the usage chunk), `__verbose`, and `fields`: more of the choice's own (a paused tool
        loop's `pending_approval`)."""
        top = final_timings(final) if timings else {}
        if verbose is not None:
            top["__verbose"] = verbose
        return [*self.open(index), self.chunk({}, final_reason(final), index, top, **(fields or {}))]

    def end(
        self,
        final: TokenEvent | None,
        usage_fields: dict[str, Any],
        n: int = 1,
        verbose: Any = None,
        fields: dict[str, Any] | None = None,
    ) -> list[bytes]:
        """The finish chunk (`n` choices: theirs came as they finished; `fields` on the one's), the usage
        chunk if asked for, and [DONE]. The timings ride on the last of them, as llama-server's."""
        usage = bool((self.body.stream_options or {}).get("include_usage"))
        out = self.finish(final, timings=not usage, verbose=verbose, fields=fields) if n == 1 else []
        if usage:
            timings = final_timings(final) if n == 1 else {}
            out.append(sse.event({**self.head, "choices": [], "usage": usage_fields, **timings}))
        return [*out, sse.DONE]


ROLE: dict[str, Any] = {"role": "assistant", "content": None}  # a choice's first delta


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
