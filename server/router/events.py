"""`/models/sse`'s events: a fan-out of the router's model events to every listener.

Each listener has its own bounded queue; a listener too slow to keep up loses its oldest events rather
than holding the router's memory (status events are idempotent: the next one says the whole state).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from server.http import sse

LISTENER_QUEUE = 256


class EventHub:
    def __init__(self) -> None:
        self._listeners: set[asyncio.Queue[dict[str, Any]]] = set()

    def publish(self, model: str, event: str, data: dict[str, Any] | None = None) -> None:
        message = {"model": model, "event": event, "data": data or {}}
        for queue in self._listeners:
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(message)

    async def listen(self, first: list[dict[str, Any]]) -> AsyncIterator[bytes]:
        """SSE bytes: `first` (the current state), then every event until the client leaves."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(LISTENER_QUEUE)
        self._listeners.add(queue)
        try:
            for message in first:
                yield sse.event(message)
            while True:
                yield sse.event(await queue.get())
        finally:
            self._listeners.discard(queue)
