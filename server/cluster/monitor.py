"""Each replica's monitor: where its child answers, whether it is ready, and what it holds.

Until the replica is ready the monitor asks the actor (through Ray) where its child answers; a new
incarnation id there means Ray started (or restarted) the actor, so the replica's old conversations are
gone. Once the child's `/health` is 200 the replica is ready, and the monitor polls its `/slots/prefixes`
every `poll_s` seconds (its prompt-cache summary and load). A poll the child refuses (or answers
wrongly) marks it down at once (a poll that times out does not: a busy replica is alive).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import structlog

from server.cluster.placement import DRAINING, READY, STARTING, Replica
from server.model.prefixes import HASH_BYTES

log = structlog.get_logger("cluster")

ACTOR_TIMEOUT_S = 5.0  # a describe call that takes longer: the actor is being (re)started
POLL_TIMEOUT_S = 5.0


class ReplicaHandle(Protocol):
    """The Ray actor of one replica, as the fleet uses it (`server/cluster/main.py` wraps Ray's)."""

    def describe(self) -> Awaitable[dict[str, Any]]: ...

    def stop(self) -> Awaitable[Any]: ...

    def kill(self) -> None: ...


class ReplicaMonitor:
    """The monitors of one model's replicas; `mark_down(replica, reason)` when one is found gone."""

    def __init__(
        self,
        model_id: str,
        client: httpx.AsyncClient,
        secret: str,
        poll_s: float,
        mark_down: Callable[[Replica, str], None],
    ) -> None:
        self.model_id = model_id
        self.poll_s = poll_s
        self.replaced = 0  # replicas Ray restarted after their death
        self._client = client
        self._auth = {"Authorization": f"Bearer {secret}"}
        self._mark_down = mark_down

    async def watch(self, replica: Replica, handle: ReplicaHandle) -> None:
        """The replica's monitor task: attach until ready, then poll, every `poll_s`, until cancelled."""
        while True:
            try:
                if replica.status in (READY, DRAINING):
                    await self._poll(replica)
                else:
                    await self._attach(replica, handle)
            except Exception as exc:  # a monitor must outlive any one failure
                log.warning(
                    "replica.monitor_error", model=self.model_id, replica=replica.index, error=repr(exc)
                )
            await asyncio.sleep(self.poll_s)

    async def _attach(self, replica: Replica, handle: ReplicaHandle) -> None:
        """Learn where the actor's child answers; ready once its /health says so."""
        try:
            info = await asyncio.wait_for(handle.describe(), ACTOR_TIMEOUT_S)
        except Exception:  # dead, restarting or not yet placed: Ray's business, ask again later
            return
        if info["incarnation"] != replica.incarnation:
            if replica.incarnation is not None:
                replica.restarts += 1
                self.replaced += 1
                log.warning(
                    "replica.replaced",
                    model=self.model_id,
                    replica=replica.index,
                    url=info["url"],
                    pid=info["pid"],
                )
            replica.incarnation, replica.url, replica.pid = info["incarnation"], info["url"], info["pid"]
            replica.node_ip, replica.status, replica.hashes = info["node_ip"], STARTING, set()
        try:
            health = await self._client.get(replica.url + "/health", timeout=POLL_TIMEOUT_S)
        except httpx.HTTPError:
            return
        if replica.status == DRAINING:  # Ray restarted a draining replica: it stays out, to be stopped
            return
        if health.status_code == 200 and await self._poll(replica):  # its engine answers too
            replica.status = READY
            log.info(
                "replica.ready",
                model=self.model_id,
                replica=replica.index,
                url=replica.url,
                node=replica.node_ip,
            )

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
            self._mark_down(replica, f"poll failed: {exc!r}")
            return False
        hashes = summary.get("hashes", [])
        replica.hashes = {h for h in hashes if isinstance(h, str) and len(h) == 2 * HASH_BYTES}
        replica.n_slots = int(summary.get("n_slots", 0))
        replica.n_busy = int(summary.get("n_busy", 0))
        replica.n_waiting = int(summary.get("n_waiting", 0))
        return True
