"""The cluster router's `/metrics` (Prometheus text): its own families per model and replica (requests,
placements by reason, retries, replicas by status, replacements, each replica's load as last polled,
autoscaling's desired count and decisions), then every live replica's own `/metrics` (`llamacpp:*`)
labelled `model` and `replica`. The exposition parsing, labels and rendering (prometheus_client's) are
the router's (`server/router/metrics.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from prometheus_client.metrics_core import Metric

from server.cluster.fleet import Fleet
from server.cluster.placement import Replica
from server.router.metrics import CONTENT_TYPE, Families, add, add_exposition, family, render, scrape_url
from server.router.upstream import UpstreamClient

PREFIX = "llamba:cluster_"
__all__ = ["CONTENT_TYPE", "aggregate", "cluster_families"]

PerReplica = Callable[[Replica], float]
REPLICA_FAMILIES: tuple[tuple[str, str, str, PerReplica], ...] = (
    ("requests_total", "counter", "Requests the router sent to the replica.", lambda r: r.served),
    ("requests_in_flight", "gauge", "Requests forwarded to the replica now.", lambda r: r.in_flight),
    ("replica_busy_slots", "gauge", "The replica's busy slots, as last polled.", lambda r: r.n_busy),
    ("replica_waiting", "gauge", "Requests queued at the replica, as last polled.", lambda r: r.n_waiting),
    ("replica_queue", "gauge", "Requests beyond the replica's slots.", lambda r: r.queued),
    ("replica_cached_blocks", "gauge", "Prompt-cache blocks the replica reported.", lambda r: len(r.hashes)),
    ("replica_restarts_total", "counter", "Times Ray replaced the replica.", lambda r: r.restarts),
)  # fmt: skip

PerFleet = Callable[[Fleet], float]
MODEL_FAMILIES: tuple[tuple[str, str, str, PerFleet], ...] = (
    ("retries_total", "counter", "Requests re-sent: a replica was unreachable.", lambda f: f.routing.retries),
    ("replicas_replaced_total", "counter", "Dead replicas Ray replaced.", lambda f: f.replaced),
    ("replicas_up", "gauge", "Replicas ready for new requests.", lambda f: len(f.ready)),
    ("replicas_current", "gauge", "Replicas not draining (ready or starting).", lambda f: f.current),
    ("replicas_desired", "gauge", "Replicas the autoscaler wants now.", lambda f: _desired(f)),
    ("replicas_min", "gauge", "Autoscaling's fewest replicas.", lambda f: f.scaler.policy.min_replicas),
    ("replicas_max", "gauge", "Autoscaling's most replicas.", lambda f: f.scaler.policy.max_replicas),
    ("queue_per_replica", "gauge", "Queued requests per ready replica, as the autoscaler sees it.",
     lambda f: f.scaler.sample(0).queue),
    ("utilisation", "gauge", "Busy and queued requests per slot, as the autoscaler sees it.",
     lambda f: f.scaler.sample(0).utilisation),
)  # fmt: skip


def _desired(fleet: Fleet) -> int:
    decision = fleet.scaler.last_decision
    return decision.desired if decision is not None else fleet.current


def cluster_families(fleets: list[Fleet]) -> Families:
    families: Families = {}

    def new(suffix: str, kind: str, help_text: str) -> Metric:
        return family(families, PREFIX + suffix, kind, help_text)

    for suffix, kind, help_text, per_replica in REPLICA_FAMILIES:
        f = new(suffix, kind, help_text)
        for fleet in fleets:
            for r in fleet.replicas:
                add(f, per_replica(r), fleet.model_id, replica=str(r.index))
    status = new(
        "replica_status", "gauge", "1 for the replica's status now (starting, ready, draining, down)."
    )
    placements = new(
        "placements_total", "counter", "New requests placed, by reason (prefix hit, least loaded, sticky)."
    )
    decisions = new(
        "scale_decisions_total", "counter", "Autoscaling decisions that added or drained a replica."
    )
    for fleet in fleets:
        for r in fleet.replicas:
            add(status, 1, fleet.model_id, replica=str(r.index), status=r.status)
        for reason, count in fleet.routing.placed.items():
            add(placements, count, fleet.model_id, reason=reason)
        for action, count in fleet.scaler.decisions.items():
            add(decisions, count, fleet.model_id, action=action)
    for suffix, kind, help_text, per_fleet in MODEL_FAMILIES:
        f = new(suffix, kind, help_text)
        for fl in fleets:
            add(f, per_fleet(fl), fl.model_id)
    return families


async def aggregate(fleets: list[Fleet], client: UpstreamClient, secret: str) -> str:
    families = cluster_families(fleets)
    live = [(fleet, r) for fleet in fleets for r in fleet.serving]
    texts = await asyncio.gather(*(scrape_url(client, secret, r.url) for _, r in live))
    for (fleet, replica), text in zip(live, texts, strict=True):
        if text is not None:
            add_exposition(families, text, fleet.model_id, replica=str(replica.index))
    return render(families)
