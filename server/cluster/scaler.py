"""One model's autoscaling at work: with `--replicas-min` < `--replicas-max` a task samples the replicas'
load every `poll_s` and applies `server/cluster/autoscale.py`'s policy: up starts one more actor; down
drains one (no new requests; its conversations still reach it) until it is idle and its conversations
have been quiet for `--stream-ttl` seconds, or `DRAIN_MAX_S` at most, then stops its actor. Each change
is a `cluster.scale` log line and counted in /metrics.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

import structlog

from server.cluster.autoscale import DOWN as SCALE_DOWN
from server.cluster.autoscale import HOLD, UP, Decision, ReplicaLoad, Sample, ScalePolicy
from server.cluster.placement import DOWN, DRAINING, READY, STARTING, Replica
from server.cluster.replicas import ReplicaSet

log = structlog.get_logger("cluster")

DRAIN_MAX_S = 600.0  # a draining replica is stopped after this long even if still busy


class Scaler:
    """The autoscaling of one model's replicas under `policy`."""

    def __init__(
        self, replicas: ReplicaSet, policy: ScalePolicy, poll_s: float, conversation_ttl_s: float
    ) -> None:
        self.policy = policy
        self._set = replicas
        self._poll_s = poll_s
        self._conversation_ttl_s = conversation_ttl_s
        self._history: deque[Sample] = deque()
        self._last_change: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._draining: set[asyncio.Task[None]] = set()
        # Counters for /metrics (server/cluster/metrics.py) and /models.
        self.decisions = {UP: 0, SCALE_DOWN: 0}
        self.last_decision: Decision | None = None

    def start(self) -> None:
        """Sample and decide every `poll_s`, unless the policy fixes the count."""
        if not self.policy.fixed:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        for task in [*self._draining, *([self._task] if self._task else [])]:
            task.cancel()

    def sample(self, now: float) -> Sample:
        replicas = self._set.replicas
        loads = tuple(
            ReplicaLoad(min(r.load, r.n_slots), r.queued, r.n_slots) for r in replicas if r.status == READY
        )
        starting = sum(1 for r in replicas if r.status in (STARTING, DOWN))
        return Sample(now, loads, starting)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            try:
                self.scale_step(time.monotonic())
            except Exception as exc:  # the scaler must outlive any one failure
                log.warning("cluster.scale_error", model=self._set.model_id, error=repr(exc))

    def scale_step(self, now: float) -> Decision:
        """Sample, decide, apply: one tick of the scaler."""
        self._history.append(self.sample(now))
        while self._history and self._history[0].t < now - self.policy.horizon_s - self._poll_s:
            self._history.popleft()
        decision = self.policy.decide(self._history, self._set.current, self._last_change, now)
        self.last_decision = decision
        if decision.action == HOLD:
            return decision
        self.decisions[decision.action] += 1
        self._last_change = now
        self._history.clear()  # the next decision reads load seen after this change only
        if decision.action == UP:
            replica = self._set.add()
        else:
            replica = self._drain_candidate()
            self._begin_drain(replica)
        log.info(
            "cluster.scale",
            model=self._set.model_id,
            action=decision.action,
            reason=decision.reason,
            replica=replica.index,
            current=self._set.current,
            desired=decision.desired,
            **decision.figures,
        )
        return decision

    def _drain_candidate(self) -> Replica:
        """The least loaded ready replica, the newest on a tie; a not-ready one first (it serves nobody)."""
        live = [r for r in self._set.replicas if r.status != DRAINING]
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
            if (idle and (quiet or not replica.url)) or replica.index in self._set.lost:
                break
            await asyncio.sleep(self._poll_s)
        await self._set.retire(replica)
        log.info(
            "cluster.drained",
            model=self._set.model_id,
            replica=replica.index,
            seconds=round(time.monotonic() - started, 1),
            current=self._set.current,
        )
