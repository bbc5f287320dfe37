"""A Responses API response's output items built from token events: the stream's item events as they
come (output_item.added, content_part.added, the deltas, their .done events, output_item.done) and the
finished items, which the stored response and a whole reply hold (the same items, so a stream and a
whole reply agree).

Items follow each other as the generation's parts do: a `reasoning` item while reasoning streams, a
`message` item for the answer, a `function_call` item per call. One item is open at a time.
"""

from __future__ import annotations

import uuid
from typing import Any

from engine.api import TokenEvent, ToolCallDelta

Payload = dict[str, Any]  # one stream event, before its sequence number


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class OutputItems:
    """The output items of one response, fed token events in order."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []  # finished and open items, in output order
        self.n_reasoning_tokens = 0
        self._open: int | None = None
        self._call_items: dict[int, int] = {}  # tool-call index -> its item index

    def feed(self, event: TokenEvent) -> list[Payload]:
        out: list[Payload] = []
        if event.reasoning_text:
            self.n_reasoning_tokens += event.token is not None
            out += self._text("reasoning", event.reasoning_text)
        if event.text:
            out += self._text("message", event.text)
        for step in event.tool_calls:
            out += self._tool_step(step)
        return out

    def close(self, status: str = "completed") -> list[Payload]:
        """Finish the open item (`status` incomplete when the output was cut at its length limit)."""
        if self._open is None:
            return []
        index, self._open = self._open, None
        item = self.items[index]
        item["status"] = status
        head = {"item_id": item["id"], "output_index": index}
        out: list[Payload] = []
        if item["type"] == "function_call":
            out.append(
                {"type": "response.function_call_arguments.done", **head, "arguments": item["arguments"]}
            )
        else:
            part = item["content"][0]
            done = (
                "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
            )
            extra = {} if item["type"] == "reasoning" else {"logprobs": []}
            out.append({"type": done, **head, "content_index": 0, "text": part["text"], **extra})
            out.append({"type": "response.content_part.done", **head, "content_index": 0, "part": dict(part)})
        out.append({"type": "response.output_item.done", "output_index": index, "item": copy_item(item)})
        return out

    def finished(self) -> list[dict[str, Any]]:
        """The items done so far (all of them once the response ends)."""
        return [copy_item(item) for i, item in enumerate(self.items) if i != self._open]

    def _start(self, item: dict[str, Any], part: dict[str, Any] | None) -> list[Payload]:
        out = self.close()
        self.items.append(item)
        index = self._open = len(self.items) - 1
        out.append({"type": "response.output_item.added", "output_index": index, "item": copy_item(item)})
        if part is not None:
            item["content"].append(part)
            head = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append({"type": "response.content_part.added", **head, "part": dict(part)})
        return out

    def _text(self, kind: str, text: str) -> list[Payload]:
        out: list[Payload] = []
        if self._open is None or self.items[self._open]["type"] != kind:
            if kind == "reasoning":
                item = {"id": item_id("rs"), "type": "reasoning", "summary": [], "content": []}
                part = {"type": "reasoning_text", "text": ""}
            else:
                item = {"id": item_id("msg"), "type": "message", "role": "assistant", "content": []}
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self._start(item | {"status": "in_progress"}, part)
        index = self._open
        assert index is not None
        item = self.items[index]
        item["content"][0]["text"] += text
        head = {"item_id": item["id"], "output_index": index, "content_index": 0, "delta": text}
        if kind == "reasoning":
            return [*out, {"type": "response.reasoning_text.delta", **head}]
        return [*out, {"type": "response.output_text.delta", **head, "logprobs": []}]

    def _tool_step(self, step: ToolCallDelta) -> list[Payload]:
        out: list[Payload] = []
        if step.index not in self._call_items:
            call_id = step.id or item_id("call")
            item = {"id": item_id("fc"), "type": "function_call", "call_id": call_id, "name": step.name or ""}
            out += self._start(item | {"arguments": "", "status": "in_progress"}, None)
            self._call_items[step.index] = len(self.items) - 1
        index = self._call_items[step.index]
        item = self.items[index]
        if step.arguments:
            item["arguments"] += step.arguments
            delta = {"item_id": item["id"], "output_index": index, "delta": step.arguments}
            out.append({"type": "response.function_call_arguments.delta", **delta})
        return out


def copy_item(item: dict[str, Any]) -> dict[str, Any]:
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied


def output_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output as the chat messages a conversation continuing it holds: one assistant
    message (its reasoning, text and calls)."""
    text = "".join(p["text"] for i in items if i["type"] == "message" for p in i["content"])
    reasoning = "".join(p["text"] for i in items if i["type"] == "reasoning" for p in i["content"])
    calls = [
        {"id": i["call_id"], "type": "function", "function": {"name": i["name"], "arguments": i["arguments"]}}
        for i in items
        if i["type"] == "function_call"
    ]
    if not (text or reasoning or calls):
        return []
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return [message]
