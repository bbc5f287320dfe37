"""The replicas of one model of the cluster: started through Ray, watched, replaced, scaled, and who
owns which conversation.

Each replica has a monitor task. Until the replica is ready it asks the actor (through Ray) where its
child answers; a new incarnation id there means Ray started (or restarted) the actor, so the replica's
old conversations are gone. Once the child's `/health` is 200 the replica is ready, and the monitor polls
its `/slots/prefixes` every `poll_s` seconds (its prompt-cache summary and load). A poll the child
refuses (or answers wrongly), or a proxied request that cannot reach it, marks it down at once (a poll
that times out does not: a busy replica is alive): it gets no new requests, its
conversations answer 404, and the monitor waits for Ray's replacement.

With `--replicas-min` < `--replicas-max` a scaler task samples the replicas' load every `poll_s` and
applies `server/cluster/autoscale.py`'s policy: up starts one more actor (`spawn`); down drains one
(no new requests; its conversations still reach it) until it is idle and its conversations have been
quiet for `--stream-ttl` seconds, or `DRAIN_MAX_S` at most, then stops its actor. Each change is a
`cluster.scale` log line and counted in /metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import httpx
import structlog

from server.cluster.autoscale import DOWN as SCALE_DOWN
from server.cluster.autoscale import HOLD, UP, Decision, ReplicaLoad, Sample, ScalePolicy
from server.cluster.placement import DOWN, DRAINING, READY, STARTING, Placement, Replica, place
from server.model.prefixes import HASH_BYTES

log = structlog.get_logger("cluster")

ACTOR_TIMEOUT_S = 5.0  # a describe call that takes longer: the actor is being (re)started
POLL_TIMEOUT_S = 5.0
MAX_OWNERS = 10_000  # conversations remembered; the oldest are forgotten first
DRAIN_MAX_S = 600.0  # a draining replica is stopped after this long even if still busy


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
    """One model's replicas. `spawn` starts one more replica's actor (a new Ray actor each call)."""

    def __init__(
        self,
        model_id: str,
        spawn: Callable[[], ReplicaHandle],
        client: httpx.AsyncClient,
        secret: str,
        scaling: ScalePolicy,
        initial: int,
        poll_s: float = 0.5,
        policy: str = "prefix",
        conversation_ttl_s: float = 300.0,
    ) -> None:
        self.model_id = model_id
        self.replicas: list[Replica] = []
        self.scaling = scaling
        self._initial = initial
        self._spawn = spawn
        self._handles: dict[int, ReplicaHandle] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._client = client
        self._auth = {"Authorization": f"Bearer {secret}"}
        self._poll_s = poll_s
        self._policy = policy
        self._conversation_ttl_s = conversation_ttl_s
        self._owners: OrderedDict[str, tuple[int, str | None]] = OrderedDict()
        self._next_index = 0
        self._history: deque[Sample] = deque()
        self._last_change: float | None = None
        self._scaler: asyncio.Task[None] | None = None
        self._draining: set[asyncio.Task[None]] = set()
        self._lost: set[int] = set()  # draining replicas that died: stop them now, serve nothing there
        # Counters for /metrics (server/cluster/metrics.py).
        self.placed = {"prefix": 0, "load": 0, "sticky": 0}
        self.retries = 0  # requests sent to another replica after one could not be reached
        self.replaced = 0  # replicas Ray restarted after their death
        self.decisions = {UP: 0, SCALE_DOWN: 0}
        self.last_decision: Decision | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        for _ in range(self._initial):
            self.add()
        if not self.scaling.fixed:
            self._scaler = asyncio.get_running_loop().create_task(self._scale())

    def add(self) -> Replica:
        """Start one more replica (a new actor) and its monitor."""
        replica = Replica(self._next_index)
        self._next_index += 1
        handle = self._spawn()
        self.replicas.append(replica)
        self._handles[replica.index] = handle
        task = asyncio.get_running_loop().create_task(self._monitor(replica, handle))
        self._tasks[replica.index] = task
        return replica

    async def stop(self) -> None:
        for task in [*self._tasks.values(), *self._draining, *([self._scaler] if self._scaler else [])]:
            task.cancel()
        await asyncio.gather(*(self._stop_actor(h) for h in self._handles.values()))

    @staticmethod
    async def _stop_actor(handle: ReplicaHandle) -> None:
        with contextlib.suppress(Exception):  # the child drains; a dead or stuck actor is killed
            await asyncio.wait_for(handle.stop(), ACTOR_TIMEOUT_S * 2)
        with contextlib.suppress(Exception):
            handle.kill()

    async def _monitor(self, replica: Replica, handle: ReplicaHandle) -> None:
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
            self.mark_down(replica, f"poll failed: {exc!r}")
            return False
        hashes = summary.get("hashes", [])
        replica.hashes = {h for h in hashes if isinstance(h, str) and len(h) == 2 * HASH_BYTES}
        replica.n_slots = int(summary.get("n_slots", 0))
        replica.n_busy = int(summary.get("n_busy", 0))
        replica.n_waiting = int(summary.get("n_waiting", 0))
        return True

    def mark_down(self, replica: Replica, reason: str) -> None:
        """No new requests for it, its conversations are gone; the monitor waits for Ray's replacement
        (a draining replica that dies is stopped at once instead)."""
        if replica.status == DOWN or replica.index in self._lost:
            return
        if replica.status == DRAINING:
            self._lost.add(replica.index)
        else:
            replica.status = DOWN
        replica.hashes = set()
        log.warning(
            "replica.down", model=self.model_id, replica=replica.index, url=replica.url, reason=reason
        )

    # -- autoscaling ----------------------------------------------------------------------------------
    @property
    def current(self) -> int:
        """Replicas counted by the policy: all but the draining ones."""
        return sum(1 for r in self.replicas if r.status != DRAINING)

    def sample(self, now: float) -> Sample:
        loads = tuple(
            ReplicaLoad(min(r.load, r.n_slots), r.queued, r.n_slots)
            for r in self.replicas
            if r.status == READY
        )
        starting = sum(1 for r in self.replicas if r.status in (STARTING, DOWN))
        return Sample(now, loads, starting)

    async def _scale(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                self.scale_step(time.monotonic())
            except Exception as exc:  # the scaler must outlive any one failure
                log.warning("cluster.scale_error", model=self.model_id, error=repr(exc))

    def scale_step(self, now: float) -> Decision:
        """Sample, decide, apply: one tick of the scaler."""
        self._history.append(self.sample(now))
        while self._history and self._history[0].t < now - self.scaling.horizon_s - self._poll_s:
            self._history.popleft()
        decision = self.scaling.decide(self._history, self.current, self._last_change, now)
        self.last_decision = decision
        if decision.action == HOLD:
            return decision
        self.decisions[decision.action] += 1
        self._last_change = now
        self._history.clear()  # the next decision reads load seen after this change only
        if decision.action == UP:
            replica = self.add()
        else:
            replica = self._drain_candidate()
            self._begin_drain(replica)
        log.info(
            "cluster.scale",
            model=self.model_id,
            action=decision.action,
            reason=decision.reason,
            replica=replica.index,
            current=self.current,
            desired=decision.desired,
            **decision.figures,
        )
        return decision

    def _drain_candidate(self) -> Replica:
        """The least loaded ready replica, the newest on a tie; a not-ready one first (it serves nobody)."""
        live = [r for r in self.replicas if r.status != DRAINING]
        idle = [r for r in live if r.status != READY]
        return idle[-1] if idle else min(live, key=lambda r: (r.load, -r.index))

    def _begin_drain(self, replica: Replica) -> None:
        replica.status = DRAINING
        task = asyncio.get_running_loop().create_task(self._drain(replica, time.monotonic()))
        self._draining.add(task)
        task.add_done_callback(self._draining.discard)

    async def _drain(self, replica: Replica, started: float) -> None:
        """Wait until it is idle and its conversations quiet (or DRAIN_MAX_S), then stop its actor."""
        while (now := time.monotonic()) - started < DRAIN_MAX_S:
            idle = replica.in_flight == 0 and replica.n_busy + replica.n_waiting == 0
            quiet = now - replica.last_conversation >= self._conversation_ttl_s
            if (idle and (quiet or not replica.url)) or replica.index in self._lost:
                break
            await asyncio.sleep(self._poll_s)
        task = self._tasks.pop(replica.index, None)
        if task is not None:
            task.cancel()
        handle = self._handles.pop(replica.index)
        await self._stop_actor(handle)
        self.replicas.remove(replica)
        self._lost.discard(replica.index)
        log.info(
            "cluster.drained",
            model=self.model_id,
            replica=replica.index,
            seconds=round(time.monotonic() - started, 1),
            current=self.current,
        )

    # -- placement and ownership ----------------------------------------------------------------------
    @property
    def ready(self) -> list[Replica]:
        return [r for r in self.replicas if r.status == READY]

    @property
    def serving(self) -> list[Replica]:
        """The replicas whose running requests and conversations can still be reached (ready or
        draining)."""
        return [r for r in self.replicas if r.status in (READY, DRAINING) and r.index not in self._lost]

    def get(self, index: int) -> Replica | None:
        return next((r for r in self.replicas if r.index == index), None)

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
        if exclude:
            self.retries += 1
        placement.replica.hashes.update(prompt_hashes)  # what it will hold once this prompt is in
        return ReplicaLease(self, placement.replica)

    def owner(self, conversation: str) -> Replica | None:
        """The live replica whose incarnation holds the conversation's session, if any (a draining one
        still serves its conversations)."""
        owned = self._owners.get(conversation)
        if owned is None:
            return None
        replica = self.get(owned[0])
        if (
            replica is None
            or replica.status not in (READY, DRAINING)
            or replica.incarnation != owned[1]
            or replica.index in self._lost
        ):
            return None
        replica.last_conversation = time.monotonic()
        return replica

    def lease(self, replica: Replica) -> ReplicaLease:
        return ReplicaLease(self, replica)

    def own(self, conversation: str, replica: Replica) -> None:
        self._owners[conversation] = (replica.index, replica.incarnation)
        self._owners.move_to_end(conversation)
        replica.last_conversation = time.monotonic()
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)
