"""`--max-queue`: how many generation requests may wait for a slot before new ones are turned away.

A request is live from its engine submission until its final event is pushed (`RequestHandle.ended`);
live requests beyond the server's slots are queued. When the queue is full a new request is a 503 with
`Retry-After` (OpenAI's SDKs retry those), rather than a wait no client deadline survives. Handles are
held weakly: one whose reader is gone without an end is forgotten with it. While the server drains
(SIGTERM with --shutdown-timeout) every new request is turned away the same way.
"""

from __future__ import annotations

import weakref

from engine.handle import RequestHandle
from server.http import errors

RETRY_AFTER_SECONDS = 1


class Admission:
    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue  # -1: no limit
        self._live: weakref.WeakSet[RequestHandle] = weakref.WeakSet()
        self.draining = False  # in-flight requests finish, new ones 503 (ModelHost.drain sets it)

    def track(self, *handles: RequestHandle) -> None:
        self._live.update(handles)

    def live(self) -> int:
        return sum(not h.ended for h in list(self._live))

    def check_open(self) -> None:
        """503 with Retry-After while the server is shutting down."""
        if self.draining:
            raise errors.APIError(
                503, "the server is shutting down", "unavailable_error", headers={"Retry-After": "1"}
            )

    def check(self, n_slots: int, wanted: int = 1) -> None:
        """503 with Retry-After when `wanted` more requests would put more than max_queue in the queue."""
        if self.max_queue < 0:
            return
        live = self.live()
        if live + wanted - n_slots > self.max_queue:
            raise errors.APIError(
                503,
                f"the server is busy: {max(0, live - n_slots)} requests wait for a slot "
                f"(--max-queue {self.max_queue}); retry later",
                "unavailable_error",
                headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
            )
