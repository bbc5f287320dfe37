"""Ollama's reply objects from the engine's token events: a chat's `message` (content, thinking, tool
calls with their arguments as objects), a generate's `response`, `done`/`done_reason`, and the metrics
every final object carries (durations in nanoseconds).

A stream is one object per event that carries text; tool calls go out whole, in one object before the
final one (Ollama sends a call when it is complete); the final object has empty text and the metrics.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from engine.api import TokenEvent, ToolCall, add_tool_call_steps
from server.apis.ollama.models import now
from server.chat.generation import raise_if_failed
from server.model.prompts import PromptBuilder


@dataclass
class Clock:
    """When the request started and when its generation could start (Ollama's load_duration)."""

    start_ns: int = field(default_factory=time.monotonic_ns)
    ready_ns: int = 0

    def ready(self) -> None:
        self.ready_ns = time.monotonic_ns()

    def metrics(self, n_prompt: int, final: TokenEvent | None) -> dict[str, int]:
        t = final.timings if final else None
        return {
            "total_duration": time.monotonic_ns() - self.start_ns,
            "load_duration": max(0, (self.ready_ns or self.start_ns) - self.start_ns),
            "prompt_eval_count": n_prompt,
            "prompt_eval_duration": int((t.prompt_ms if t else 0.0) * 1e6),
            "eval_count": t.predicted_n if t else 0,
            "eval_duration": int((t.predicted_ms if t else 0.0) * 1e6),
        }


def done_reason(final: TokenEvent | None) -> str:
    return "length" if final is not None and final.finish_reason == "length" else "stop"


def tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """Calls in Ollama's shape: `function.arguments` an object (a call whose text is no JSON object
    keeps it under `arguments` as `{}`)."""
    return [
        {"id": call.id, "function": {"index": i, "name": call.name, "arguments": arguments(call.arguments)}}
        for i, call in enumerate(calls)
    ]


def arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def logprobs(prompts: PromptBuilder, event: TokenEvent) -> list[dict[str, Any]]:
    """An event's token with its log probability and the best alternatives (Ollama's Logprob)."""
    if event.token is None or event.logprob is None:
        return []

    def entry(token: int, value: float) -> dict[str, Any]:
        raw = prompts.piece(token)
        return {"token": raw.decode("utf-8", errors="replace"), "logprob": value, "bytes": list(raw)}

    top = [entry(t, lp) for t, lp in event.top_logprobs]
    return [entry(event.token, event.logprob) | ({"top_logprobs": top} if top else {})]


class Reply:
    """One chat's or generate's reply as it comes: the stream's objects, or the whole object."""

    def __init__(self, name: str, chat: bool, prompts: PromptBuilder | None = None) -> None:
        self.name, self.chat, self.prompts = name, chat, prompts
        self.text, self.thinking = "", ""
        self.calls: list[ToolCall] = []
        self.logprobs: list[dict[str, Any]] = []
        self.tokens: list[int] = []
        self.final: TokenEvent | None = None

    def head(self) -> dict[str, Any]:
        return {"model": self.name, "created_at": now()}

    def body(self, text: str, thinking: str) -> dict[str, Any]:
        """The part that carries text: a chat's `message`, a generate's `response`."""
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            return {"message": message | ({"thinking": thinking} if thinking else {})}
        return {"response": text} | ({"thinking": thinking} if thinking else {})

    def feed(self, event: TokenEvent) -> dict[str, Any] | None:
        """The stream object of an event (None for one with nothing to show); the whole reply keeps it."""
        raise_if_failed(event)
        if event.finish_reason is not None:
            self.final = event
        if event.token is not None:
            self.tokens.append(event.token)
        add_tool_call_steps(self.calls, event.tool_calls)
        probs = logprobs(self.prompts, event) if self.prompts is not None else []
        self.text += event.text
        self.thinking += event.reasoning_text
        self.logprobs += probs
        if not (event.text or event.reasoning_text or probs):
            return None
        part = self.head() | self.body(event.text, event.reasoning_text) | {"done": False}
        return part | ({"logprobs": probs} if probs else {})

    def calls_object(self) -> dict[str, Any] | None:
        """The stream's object with the tool calls (a chat's, once they are complete)."""
        if not self.calls or not self.chat:
            return None
        part = self.head() | self.body("", "") | {"done": False}
        part["message"]["tool_calls"] = tool_calls(self.calls)
        return part

    def end(self, metrics: dict[str, int], whole: bool) -> dict[str, Any]:
        """The final object: the whole text (`whole`), or empty text after a stream; why it ended and
        the metrics."""
        out = self.head() | self.body(self.text, self.thinking) if whole else self.head() | self.body("", "")
        if whole and self.calls and self.chat:
            out["message"]["tool_calls"] = tool_calls(self.calls)
        out |= {"done": True, "done_reason": done_reason(self.final)} | metrics
        if whole and self.logprobs:
            out["logprobs"] = self.logprobs
        return out


def load_object(name: str, chat: bool) -> dict[str, Any]:
    """The answer to a request with nothing to generate (no messages, an empty prompt): the model is
    loaded (Ollama's `done_reason` "load")."""
    part = {"message": {"role": "assistant", "content": ""}} if chat else {"response": ""}
    return {"model": name, "created_at": now()} | part | {"done": True, "done_reason": "load"}
