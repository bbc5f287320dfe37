"""One model of the cluster: its replicas (`server/cluster/replicas.py`, each watched by
`server/cluster/monitor.py`), their autoscaling (`server/cluster/scaler.py`) and where its requests go
(`server/cluster/routing.py`).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from server.cluster.autoscale import ScalePolicy
from server.cluster.monitor import ReplicaHandle
from server.cluster.replicas import ReplicaSet
from server.cluster.routing import Routing
from server.cluster.scaler import Scaler


class Fleet(ReplicaSet):
    """One model's replicas, with their `scaler` and their `routing`; `initial` of them at the start."""

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
        super().__init__(model_id, spawn, client, secret, poll_s)
        self.scaler = Scaler(self, scaling, poll_s, conversation_ttl_s)
        self.routing = Routing(self, policy)
        self._initial = initial

    def start(self) -> None:
        for _ in range(self._initial):
            self.add()
        self.scaler.start()

    async def stop(self) -> None:
        self.scaler.stop()
        await super().stop()
