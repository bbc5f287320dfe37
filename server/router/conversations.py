"""Which model owns a resumable conversation (`X-Conversation-Id`), and requests parked while it loads.

A conversation's session lives in the child that generates it; the router only remembers the owner, so
`GET /v1/stream`, `DELETE /v1/stream` and `POST /v1/streams/lookup` reach it. A request whose model is
still loading is parked here: its client may leave and come back (the request goes on), a resume gets
503 "model is loading" until the child has it, and a stop cancels it before it ever reaches the child.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass, field

CONVERSATION_HEADER = "X-Conversation-Id"
# Owners remembered; the oldest are forgotten first (a child's own sessions expire far sooner).
MAX_OWNERS = 10_000


@dataclass
class Parked:
    """A conversation's request waiting for its model; `stop` cancels it."""

    model_id: str
    stopped: asyncio.Event = field(default_factory=asyncio.Event)


class Conversations:
    def __init__(self) -> None:
        self._owners: OrderedDict[str, str] = OrderedDict()
        self._parked: dict[str, Parked] = {}

    def own(self, conversation_id: str, model_id: str) -> None:
        self._owners[conversation_id] = model_id
        self._owners.move_to_end(conversation_id)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)

    def forget(self, conversation_id: str) -> None:
        """A stop while the conversation's model loads: its request never reached a child, so a resume
        is a 404 at once (llama-server's router forgets the conversation on a stop too)."""
        self._owners.pop(conversation_id, None)

    def owner(self, conversation_id: str) -> str | None:
        return self._owners.get(conversation_id)

    def park(self, conversation_id: str, model_id: str) -> Parked:
        parked = Parked(model_id)
        previous = self._parked.get(conversation_id)
        if previous is not None:  # a new request for the conversation replaces the parked one
            previous.stopped.set()
        self._parked[conversation_id] = parked
        self.own(conversation_id, model_id)
        return parked

    def unpark(self, conversation_id: str, parked: Parked) -> None:
        if self._parked.get(conversation_id) is parked:
            del self._parked[conversation_id]

    def parked(self, conversation_id: str) -> Parked | None:
        return self._parked.get(conversation_id)
