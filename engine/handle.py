"""The asyncio side of one engine request: its events as an async iterator, and its cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from engine.api import TokenEvent


class RequestHandle:
    """TokenEvents pushed by the engine thread, read on the event loop; the last has a finish_reason."""

    def __init__(
        self, request_id: str, loop: asyncio.AbstractEventLoop, cancel: Callable[[str], None]
    ) -> None:
        self.request_id = request_id
        self._loop = loop
        self._cancel = cancel
        self._queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.finished = False  # the reader has seen the final event
        self.ended = False  # the engine has pushed it (read or not): the request holds no slot any more

    def push(self, event: TokenEvent) -> None:
        """Called on the engine thread: the event is queued on the loop, never blocking either side."""
        if event.finish_reason is not None:
            self.ended = True  # a bool store: atomic under the GIL, read by server/model/admission.py
        self._loop.call_soon_threadsafe(self._queue.put_nowait, event)

    async def __aiter__(self) -> AsyncIterator[TokenEvent]:
        while not self.finished:
            event = await self._queue.get()
            self.finished = event.finish_reason is not None
            yield event

    def cancel(self) -> None:
        """End the request (a no-op once it has finished); its slot is freed at the next step."""
        if not self.finished:
            self._cancel(self.request_id)
