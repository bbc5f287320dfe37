"""Where a new request goes: the replica holding the longest cached prefix of its prompt, unless that
replica is far busier than the least loaded one; else the least loaded.

Pure functions over `Replica` values (no I/O), so the policy is tested without a cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from server.model.prefixes import matched_blocks

# A draining replica (autoscaling removes it) takes no new requests but still serves its conversations.
STARTING, READY, DOWN, DRAINING = "starting", "ready", "down", "draining"


@dataclass
class Replica:
    """One replica as the router knows it: where its child answers and what it reported last."""

    index: int
    url: str = ""
    pid: int | None = None
    incarnation: str | None = None  # a new one each time Ray (re)starts the actor
    node_ip: str | None = None
    status: str = STARTING
    in_flight: int = 0  # requests the router is forwarding to it now
    n_slots: int = 0
    n_busy: int = 0
    n_waiting: int = 0
    hashes: set[str] = field(default_factory=set)  # block-prefix hashes of its prompt cache
    restarts: int = 0  # incarnations after the first
    served: int = 0
    last_conversation: float = 0.0  # monotonic time a conversation of it last had a request

    @property
    def load(self) -> int:
        """Requests on it: the router's own count, or the replica's busy slots and queue if higher."""
        return max(self.in_flight, self.n_busy + self.n_waiting)

    @property
    def queued(self) -> int:
        """Requests on it beyond its slots: waiting at the replica, or in flight to it and not yet seen."""
        return max(0, self.load - self.n_slots) if self.n_slots else self.n_waiting

    def listing(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "status": self.status,
            "url": self.url,
            "pid": self.pid,
            "node_ip": self.node_ip,
            "incarnation": self.incarnation,
            "restarts": self.restarts,
            "in_flight": self.in_flight,
            "n_slots": self.n_slots,
            "n_busy": self.n_busy,
            "n_waiting": self.n_waiting,
            "cached_blocks": len(self.hashes),
            "served": self.served,
        }


@dataclass(frozen=True)
class Placement:
    replica: Replica
    matched_blocks: int  # blocks of the prompt its cache holds (0: placed by load)


def least_loaded(replicas: list[Replica]) -> Replica | None:
    ready = [r for r in replicas if r.status == READY]
    # Ties go to the replica that has served fewest, so sequential requests alternate.
    return min(ready, key=lambda r: (r.load, r.in_flight, r.served, r.index), default=None)


def place(replicas: list[Replica], prompt_hashes: list[str]) -> Placement | None:
    """The replica for a new request with these prompt block hashes; None when no replica is ready.

    Among the replicas with at most one slot-count more requests than the least loaded, the longest
    cached prefix wins (a prefix is worth a queue of that length, not an unbounded one: a shared system
    prompt must not send every request to one replica).
    """
    least = least_loaded(replicas)
    if least is None:
        return None
    if prompt_hashes:
        near = [r for r in replicas if r.status == READY and r.load <= least.load + max(r.n_slots, 1)]
        scored = [(matched_blocks(prompt_hashes, r.hashes), r) for r in near]
        best_n, best = max(scored, key=lambda s: (s[0], -s[1].load, -s[1].index))
        if best_n > 0:
            return Placement(best, best_n)
    return Placement(least, 0)
