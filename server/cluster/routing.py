"""Where one model's requests go: a new one to the replica the placement policy picks
(`server/cluster/placement.py`: prefix-aware, least loaded, or random as a benchmark baseline), a
conversation's next turns to the replica whose incarnation holds its session; and the lease each
request holds on its replica while it runs.
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict

from server.cluster.placement import DRAINING, READY, Placement, Replica, place
from server.cluster.replicas import ReplicaSet

MAX_OWNERS = 10_000  # conversations remembered; the oldest are forgotten first


class ReplicaLease:
    """One request on a replica (`server/router/proxy.py`'s Lease)."""

    def __init__(self, model_id: str, replica: Replica) -> None:
        self.replica = replica
        self.url = replica.url
        self.name = f"{model_id}#{replica.index}"
        self._released = False
        replica.in_flight += 1
        replica.served += 1

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.replica.in_flight -= 1


class Routing:
    """The picks among one model's replicas under the placement `policy` (prefix, least-loaded,
    random), and who owns which conversation."""

    def __init__(self, replicas: ReplicaSet, policy: str) -> None:
        self._set = replicas
        self._policy = policy
        self._owners: OrderedDict[str, tuple[int, str | None]] = OrderedDict()
        # Counters for /metrics (server/cluster/metrics.py) and /models.
        self.placed = {"prefix": 0, "load": 0, "sticky": 0}
        self.retries = 0  # requests sent to another replica after one could not be reached

    def place(self, prompt_hashes: list[str], exclude: set[int]) -> ReplicaLease | None:
        candidates = [r for r in self._set.replicas if r.index not in exclude]
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
        return self.lease(placement.replica)

    def owner(self, conversation: str) -> Replica | None:
        """The live replica whose incarnation holds the conversation's session, if any (a draining one
        still serves its conversations)."""
        owned = self._owners.get(conversation)
        if owned is None:
            return None
        replica = self._set.get(owned[0])
        if (
            replica is None
            or replica.status not in (READY, DRAINING)
            or replica.incarnation != owned[1]
            or replica.index in self._set.lost
        ):
            return None
        replica.last_conversation = time.monotonic()
        return replica

    def lease(self, replica: Replica) -> ReplicaLease:
        return ReplicaLease(self._set.model_id, replica)

    def own(self, conversation: str, replica: Replica) -> None:
        self._owners[conversation] = (replica.index, replica.incarnation)
        self._owners.move_to_end(conversation)
        replica.last_conversation = time.monotonic()
        while len(self._owners) > MAX_OWNERS:
            self._owners.popitem(last=False)
