"""The replicas of the cluster's model: started through Ray, watched, replaced, and who owns which
conversation.

Each replica has a monitor task. Until the replica is ready it asks the actor (through Ray) where its
child answers; a new incarnation id there means Ray started (or restarted) the actor, so the replica's
old conversations are gone. Once the child's `/health` is 200 the replica is ready, and the monitor polls
its `/slots/prefixes` every `poll_s` seconds (its prompt-cache summary and load). A poll the child
refuses (or answers wrongly), or a proxied request that cannot reach it, marks it down at once (a poll
that times out does not: a busy replica is alive): it gets no new requests, its
conversations answer 404, and the monitor waits for Ray's replacement.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, Protocol

import httpx
import structlog

from server.cluster.placement import DOWN, READY, STARTING, Placement, Replica, place
from server.cluster.prefixes import HASH_BYTES

log = structlog.get_logger("cluster")

ACTOR_TIMEOUT_S = 5.0  # a describe call that takes longer: the actor is being (re)started
POLL_TIMEOUT_S = 5.0
MAX_OWNERS = 10_000  # conversations remembered; the oldest are forgotten first


class ReplicaHandle(Protocol):
    """The Ray actor of one replica, as the fleet uses it (`server/cluster/main.py` wraps Ray's)."""

    def describe(self) -> Awaitable[dict[str, Any]]: ...

    def stop(self) -> Awaitable[Any]: ...

    def kill(self) -> None: ...


class ReplicaLease:
    """One request on a replica (`server/router/proxy.py`'s Lease)."""

    def __init__(self, fleet: Fleet, replica: Replica) -> None:
        self.replica = replica
        self.url = replica.url
        self.name = f"{fleet.model_id}#{replica.index}"
        self._fleet = fleet
        self._released = False
        replica.in_flight += 1
        replica.served += 1

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.replica.in_flight -= 1


class Fleet:
    def __init__(
        self,
        model_id: str,
        handles: list[ReplicaHandle],
        client: httpx.AsyncClient,
        secret: str,
        poll_s: float = 0.5,
        policy: str = "prefix",
    ) -> None:
        self.model_id = model_id
        self.replicas = [Replica(i) for i in range(len(handles))]
        self._handles = handles
        self._client = client
        self._auth = {"Authorization": f"Bearer {secret}"}
        self._poll_s = poll_s
        self._policy = policy
        self._owners: OrderedDict[str, tuple[int, str | None]] = OrderedDict()
        self._tasks: list[asyncio.Task[None]] = []
        self.placed = {"prefix": 0, "load": 0}

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        loop = asyncio.get_running_loop()
        pairs = zip(self.replicas, self._handles, strict=True)
        self._tasks = [loop.create_task(self._monitor(r, h)) for r, h in pairs]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

        async def stop_one(handle: ReplicaHandle) -> None:
            with contextlib.suppress(Exception):  # the child drains; a dead or stuck actor is killed
                await asyncio.wait_for(handle.stop(), ACTOR_TIMEOUT_S * 2)
            with contextlib.suppress(Exception):
                handle.kill()

        await asyncio.gather(*(stop_one(h) for h in self._handles))

    async def _monitor(self, replica: Replica, handle: ReplicaHandle) -> None:
        while True:
            try:
                if replica.status == READY:
                    await self._poll(replica)
                else:
                    await self._attach(replica, handle)
            except Exception as exc:  # a monitor must outlive any one failure
                log.warning("replica.monitor_error", replica=replica.index, error=repr(exc))
            await asyncio.sleep(self._poll_s)

    async def _attach(self, replica: Replica, handle: ReplicaHandle) -> None:
        """Learn where the actor's child answers; ready once its /health says so."""
        try:
            info = await asyncio.wait_for(handle.describe(), ACTOR_TIMEOUT_S)
        except Exception:  # dead, restarting or not yet placed: Ray's business, ask again later
            return
        if info["incarnation"] != replica.incarnation:
            if replica.incarnation is not None:
                replica.restarts += 1
                log.warning("replica.replaced", replica=replica.index, url=info["url"], pid=info["pid"])
            replica.incarnation, replica.url, replica.pid = info["incarnation"], info["url"], info["pid"]
            replica.node_ip, replica.status, replica.hashes = info["node_ip"], STARTING, set()
        try:
            health = await self._client.get(replica.url + "/health", timeout=POLL_TIMEOUT_S)
        except httpx.HTTPError:
            return
        if health.status_code == 200 and await self._poll(replica):  # its engine answers too
            replica.status = READY
            log.info("replica.ready", replica=replica.index, url=replica.url, node=replica.node_ip)

    async def _poll(self, replica: Replica) -> bool:
        """Read the replica's summary; False (and down) when it refuses or fails to give one."""
        try:
            answer = await self._client.get(
                replica.url + "/slots/prefixes", headers=self._auth, timeout=POLL_TIMEOUT_S
            )
            answer.raise_for_status()
            summary = answer.json()
        except httpx.TimeoutException:
            return True  # alive but busy (a long prompt step, a loaded machine): keep what it said last
        except (httpx.HTTPError, ValueError) as exc:  # refused, reset, or not a summary: it is gone
            self.mark_down(replica, f"poll failed: {exc!r}")
            return False
        hashes = summary.get("hashes", [])
        replica.hashes = {h for h in hashes if isinstance(h, str) and len(h) == 2 * HASH_BYTES}
        replica.n_slots = int(summary.get("n_slots", 0))
        replica.n_busy = int(summary.get("n_busy", 0))
        replica.n_waiting = int(summary.get("n_waiting", 0))
        return True

    def mark_down(self, replica: Replica, reason: str) -> None:
        """No new requests for it, its conversations are gone; the monitor waits for Ray's replacement."""
        if replica.status == DOWN:
            return
        replica.status, replica.hashes = DOWN, set()
        log.warning("replica.down", replica=replica.index, url=replica.url, reason=reason)

    # -- placement and ownership ----------------------------------------------------------------------
    @property
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.status == READY]

    def place(self, prompt_hashes: list[str], exclude: set[int]) -> ReplicaLease | None:
        candidates = [r for r in self.replicas if r.index not in exclude]
        placement: Placement | None
        if self._policy == "random":  # a baseline for benchmarks: what cache-blind spreading gets
            ready = [r for r in candidates if r.status == READY]
            placement = Placement(random.choice(ready), 0) if ready else None
        else:
            placement = place(candidates, prompt_hashes if self._policy == "prefix" else [])
        if placement is None:
            return None
        self.placed["prefix" if placement.matched_blocks else "load"] += 1
        placement.replica.hashes.update(prompt_hashes)  # what it will hold once this prompt is in
        return ReplicaLease(self, placement.replica)

    def owner(self, conversation: str) -> Replica | None:
        """The ready replica whose incarnation holds the conversation's session, if any."""
        owned = self._owners.get(conversation)
        if owned is None:
            return None
        replica = self.replicas[owned[0]]
        return replica if replica.status == READY and replica.incarnation == owned[1] else None

    def lease(self, replica: Replica) -> ReplicaLease:
        return ReplicaLease(self, replica)

    def own(self, conversation: str, replica: Replica) -> None:
        self._owners[conversation] = (replica.index, replica.incarnation)
        self._owners.move_to_end(conversation)
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)
