"""A ```json fence around an answer under a schema, taken off as llama.cpp's parser does.

llama.cpp reads an answer to a request with a JSON schema as its reasoning, then either the JSON or the
JSON in a ```json fence (common/chat-auto-parser-generator.cpp); the message's content is the JSON
alone. Only a fence that opens the answer is one: the closing ``` is taken off at the end, and text
that may still be the fence's beginning or end waits for more.
"""

from __future__ import annotations

from engine.text.tool_calls.common import ParseDelta, ToolCallParser

OPEN, CLOSE = "```json", "```"


class FencedJson:
    """A ToolCallParser over another (or over plain content) whose content may be a fenced answer."""

    def __init__(self, inner: ToolCallParser | None) -> None:
        self._inner = inner
        self._head = ""  # the answer's start while it may still be (a prefix of) the opening fence
        self._opened: bool | None = None  # None: not decided yet
        self._tail = ""  # inside a fence: whitespace and backticks that may be its closing
        self._lead = True  # inside a fence, before the JSON: whitespace is dropped

    def push(self, text: str) -> ParseDelta:
        delta = self._inner.push(text) if self._inner is not None else ParseDelta(text)
        return ParseDelta(self._content(delta.content, False), delta.reasoning, delta.tool_calls)

    def flush(self) -> ParseDelta:
        delta = self._inner.flush() if self._inner is not None else ParseDelta()
        return ParseDelta(self._content(delta.content, True), delta.reasoning, delta.tool_calls)

    def _content(self, text: str, final: bool) -> str:
        if self._opened is None:
            self._head += text
            lead = self._head.lstrip()
            if lead.startswith(OPEN):
                self._opened, text = True, lead[len(OPEN) :]
            elif OPEN.startswith(lead) and not final:
                return ""
            else:
                self._opened, text = False, self._head
            self._head = ""
        if not self._opened:
            return text
        held = self._tail + text
        if self._lead:
            held = held.lstrip()
            self._lead = not held
        if final:
            body = held.rstrip()
            return body[: -len(CLOSE)].rstrip() if body.endswith(CLOSE) else body
        keep = len(held) - len(held.rstrip(" \t\r\n`"))
        self._tail = held[len(held) - keep :]
        return held[: len(held) - keep]
