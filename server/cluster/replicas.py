"""One model's replicas: each started through Ray (`spawn`: a new actor), watched by its monitor
(`server/cluster/monitor.py`), replaced by Ray when it dies, retired when autoscaling drains it.

A replica that a poll finds gone, or that a proxied request cannot reach, is marked down: it gets no new
requests, its conversations answer 404, and its monitor waits for Ray's replacement. A draining replica
that dies is lost instead: it serves nothing more and is stopped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import httpx
import structlog

from server.cluster.monitor import ACTOR_TIMEOUT_S, ReplicaHandle, ReplicaMonitor
from server.cluster.placement import DOWN, DRAINING, READY, Replica

log = structlog.get_logger("cluster")


class ReplicaSet:
    """One model's replicas and their actors. `spawn` starts one more replica's actor (a new Ray actor
    each call)."""

    def __init__(
        self,
        model_id: str,
        spawn: Callable[[], ReplicaHandle],
        client: httpx.AsyncClient,
        secret: str,
        poll_s: float,
    ) -> None:
        self.model_id = model_id
        self.replicas: list[Replica] = []
        self.lost: set[int] = set()  # draining replicas that died: stop them now, serve nothing there
        self.monitor = ReplicaMonitor(model_id, client, secret, poll_s, self.mark_down)
        self._spawn = spawn
        self._handles: dict[int, ReplicaHandle] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._next_index = 0

    def add(self) -> Replica:
        """Start one more replica (a new actor) and its monitor."""
        replica = Replica(self._next_index)
        self._next_index += 1
        handle = self._spawn()
        self.replicas.append(replica)
        self._handles[replica.index] = handle
        task = asyncio.get_running_loop().create_task(self.monitor.watch(replica, handle))
        self._tasks[replica.index] = task
        return replica

    async def retire(self, replica: Replica) -> None:
        """Stop the replica's monitor and its actor, and forget it (a drained replica)."""
        task = self._tasks.pop(replica.index, None)
        if task is not None:
            task.cancel()
        handle = self._handles.pop(replica.index)
        await self._stop_actor(handle)
        self.replicas.remove(replica)
        self.lost.discard(replica.index)

    async def stop(self) -> None:
        """Every monitor cancelled, every actor stopped."""
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*(self._stop_actor(h) for h in self._handles.values()))

    @staticmethod
    async def _stop_actor(handle: ReplicaHandle) -> None:
        with contextlib.suppress(Exception):  # the child drains; a dead or stuck actor is killed
            await asyncio.wait_for(handle.stop(), ACTOR_TIMEOUT_S * 2)
        with contextlib.suppress(Exception):
            handle.kill()

    def mark_down(self, replica: Replica, reason: str) -> None:
        """No new requests for it, its conversations are gone; the monitor waits for Ray's replacement
        (a draining replica that dies is stopped at once instead)."""
        if replica.status == DOWN or replica.index in self.lost:
            return
        if replica.status == DRAINING:
            self.lost.add(replica.index)
        else:
            replica.status = DOWN
        replica.hashes = set()
        log.warning(
            "replica.down", model=self.model_id, replica=replica.index, url=replica.url, reason=reason
        )

    @property
    def replaced(self) -> int:
        """Replicas Ray restarted after their death."""
        return self.monitor.replaced

    @property
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.status == READY]

    @property
    def serving(self) -> list[Replica]:
        """The replicas whose running requests and conversations can still be reached (ready or
        draining)."""
        return [r for r in self.replicas if r.status in (READY, DRAINING) and r.index not in self.lost]

    @property
    def current(self) -> int:
        """Replicas counted by the autoscaling policy: all but the draining ones."""
        return sum(1 for r in self.replicas if r.status != DRAINING)

    def get(self, index: int) -> Replica | None:
        return next((r for r in self.replicas if r.index == index), None)
