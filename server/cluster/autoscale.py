"""The autoscaling policy of a cluster's model: from a history of polled load, add a replica, drain
one, or hold. Pure (no I/O, no clock: the caller passes `now`), so it is tested without Ray
(tests/test_cluster_autoscale.py); `server/cluster/fleet.py` samples its replicas and applies it.

Up when every sample of the last `up_after_s` seconds had a queue (requests beyond the slots, at the
replica or in flight to it) of at least `UP_QUEUE` per ready replica; down when every sample of the last
`down_after_s` seconds used at most `DOWN_UTILISATION` of the slots. The two thresholds are far apart
(hysteresis: after a drain from n to n-1 replicas, a utilisation of at most 1/4 becomes at most
1/4 * n/(n-1) <= 1/2, with no queue, so the drain does not trigger a growth), and after any change the
policy holds for the same windows (cool-downs), and while a replica is still starting (its capacity is
on the way).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

UP, DOWN, HOLD = "up", "down", "hold"
UP_QUEUE = 1.0  # queued requests per ready replica, sustained, that add a replica
DOWN_UTILISATION = 0.25  # (busy + queued) / slots, sustained, at or below which one is drained
UP_AFTER_S = 10.0  # --scale-up-after
DOWN_AFTER_S = 60.0  # --scale-down-after


@dataclass(frozen=True)
class ReplicaLoad:
    busy: int  # requests it is running (at most its slots)
    queued: int  # requests beyond its slots
    slots: int


@dataclass(frozen=True)
class Sample:
    """The model's load at one time: its ready replicas' loads and how many are still starting."""

    t: float
    loads: tuple[ReplicaLoad, ...]
    starting: int = 0

    @property
    def queue(self) -> float:
        """Queued requests per ready replica (infinite when none is ready but requests wait)."""
        queued = sum(r.queued for r in self.loads)
        return queued / len(self.loads) if self.loads else 0.0

    @property
    def utilisation(self) -> float:
        slots = sum(r.slots for r in self.loads)
        return sum(r.busy + r.queued for r in self.loads) / slots if slots else 0.0


@dataclass(frozen=True)
class Decision:
    action: str  # up | down | hold
    desired: int
    reason: str
    figures: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    up_after_s: float = UP_AFTER_S
    down_after_s: float = DOWN_AFTER_S
    up_queue: float = UP_QUEUE
    down_utilisation: float = DOWN_UTILISATION

    @property
    def fixed(self) -> bool:
        return self.min_replicas == self.max_replicas

    @property
    def horizon_s(self) -> float:
        """How much history `decide` reads."""
        return max(self.up_after_s, self.down_after_s)

    def decide(
        self, history: Sequence[Sample], current: int, last_change: float | None, now: float
    ) -> Decision:
        """`current`: replicas not draining (ready or starting); `last_change`: when the policy last
        added or drained one (None: never)."""
        if current < self.min_replicas:
            return Decision(UP, current + 1, "below the minimum")
        if current > self.max_replicas:
            return Decision(DOWN, current - 1, "above the maximum")
        latest = history[-1] if history else None
        if latest is None:
            return Decision(HOLD, current, "no load sampled yet")
        figures = {"queue": round(latest.queue, 2), "utilisation": round(latest.utilisation, 2)}
        if latest.starting:
            return Decision(HOLD, current, "a replica is starting", figures)
        since = now - last_change if last_change is not None else None
        up = self._sustained(history, now, self.up_after_s, lambda s: s.queue >= self.up_queue)
        if up and current < self.max_replicas:
            if since is not None and since < self.up_after_s:
                return Decision(HOLD, current, "queue high, cooling down", figures)
            reason = f"queue >= {self.up_queue:g} per replica for {self.up_after_s:g} s"
            return Decision(UP, current + 1, reason, figures)
        down = self._sustained(
            history, now, self.down_after_s, lambda s: s.utilisation <= self.down_utilisation
        )
        if down and current > self.min_replicas:
            if since is not None and since < self.down_after_s:
                return Decision(HOLD, current, "load low, cooling down", figures)
            reason = f"utilisation <= {self.down_utilisation:g} for {self.down_after_s:g} s"
            return Decision(DOWN, current - 1, reason, figures)
        return Decision(HOLD, current, "load within bounds", figures)

    @staticmethod
    def _sustained(history: Sequence[Sample], now: float, window_s: float, holds: Any) -> bool:
        """The history covers the whole window (its first sample is at least as old) and every sample
        in the window satisfies `holds`, with at least one ready replica in each."""
        if not history or history[0].t > now - window_s:
            return False
        window = [s for s in history if s.t >= now - window_s]
        return bool(window) and all(s.loads and holds(s) for s in window)
