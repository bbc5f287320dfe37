"""The router's `/metrics` (Prometheus text format): its own counters per model, then every running
child's own `/metrics` (llama-server's `llamacpp:*` families and Llamba's latency histograms), parsed with
prometheus_client's parser, each sample labelled `model="<id>"` (a histogram's `_bucket`, `_sum` and
`_count` samples alike, so each model keeps its own distribution), merged into one family per name and
rendered by prometheus_client's exposition (labels in its order: sorted by name). `/metrics?model=<id>`
is proxied to that child instead, as llama-server's router does (it has no aggregate)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

import structlog
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from server.router.pool import ModelPool
from server.router.state import RUNNING, ModelState
from server.router.upstream import UpstreamClient, UpstreamError

log = structlog.get_logger("router")

CONTENT_TYPE = "text/plain; version=0.0.4"
SCRAPE_TIMEOUT_S = 5.0  # a child that does not answer in time is left out of this scrape

Value = Callable[[ModelState, ModelPool], float]
ROUTER_FAMILIES: tuple[tuple[str, str, str, Value], ...] = (
    ("requests_total", "counter", "Requests forwarded to the model.", lambda s, p: s.requests),
    ("requests_in_flight", "gauge", "Requests being forwarded to the model now.", lambda s, p: s.in_flight),
    ("requests_queued", "gauge", "Requests waiting for the model's load or room.", lambda s, p: p.queued(s)),
    ("loads_total", "counter", "Times the model's child was started.", lambda s, p: s.loads),
    ("failures_total", "counter", "Failed loads and crashes of the model's child.", lambda s, p: s.failures),
    ("evictions_total", "counter", "Unloads to make room for another model.", lambda s, p: s.evictions),
)

Families = dict[str, Metric]  # by family name (a counter's without `_total`, as prometheus_client keeps it)


def family(families: Families, name: str, kind: str, help_text: str) -> Metric:
    """The family `name` (a counter's name with its `_total`), made empty on first use."""
    key = name.removesuffix("_total") if kind == "counter" else name
    found = families.get(key)
    if found is None:
        found = families[key] = Metric(key, help_text, kind)
    return found


def add(metric: Metric, value: float, model: str, **labels: str) -> None:
    """One sample of a counter or gauge family, labelled `model` (and `labels`)."""
    name = metric.name + "_total" if metric.type == "counter" else metric.name
    metric.add_sample(name, {"model": model, **labels}, value)


def add_exposition(families: Families, text: str, model: str, **extra: str) -> None:
    """One child's metrics into `families`, its samples labelled with its model (and `extra`, e.g. a
    cluster's `replica`); a page that does not parse is left out of this scrape, and logged."""
    try:
        parsed = list(text_string_to_metric_families(text))
    except ValueError as exc:
        log.warning("metrics.unparsable", model=model, error=str(exc), **extra)
        return
    for child in parsed:
        merged = families.get(child.name)
        if merged is None:
            merged = families[child.name] = Metric(child.name, child.documentation, child.type)
        merged.samples.extend(s._replace(labels={**s.labels, "model": model, **extra}) for s in child.samples)


def router_families(pool: ModelPool) -> Families:
    families: Families = {}
    for suffix, kind, help_text, value in ROUTER_FAMILIES:
        f = family(families, f"llamba:router_{suffix}", kind, help_text)
        for state in pool.states.values():
            add(f, value(state, pool), state.id)
    status = family(
        families,
        "llamba:router_model_status",
        "gauge",
        "1 for the model's status now (unloaded, loading...).",
    )
    for state in pool.states.values():
        add(status, 1, state.id, status=state.status)
    return families


async def scrape(client: UpstreamClient, secret: str, state: ModelState) -> str | None:
    """A running child's /metrics text, or None (it went away, or its metrics are off)."""
    child = state.child
    return None if child is None else await scrape_url(client, secret, child.url)


async def scrape_url(client: UpstreamClient, secret: str, url: str) -> str | None:
    """The /metrics text of the server at `url` (a router child, a cluster replica), or None."""
    headers = [("Authorization", f"Bearer {secret}")]
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            answer = await client.send(url, "GET", "/metrics", headers, b"")
            try:
                body = await answer.aread()
            finally:
                await answer.aclose()
    except (UpstreamError, TimeoutError):
        return None
    return body.decode() if answer.status_code == 200 else None


class Page:
    """Families as prometheus_client's exposition collects them."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> list[Metric]:
        return self.families


def render(families: Families) -> str:
    return generate_latest(Page(families.values())).decode()


async def aggregate(pool: ModelPool, client: UpstreamClient, secret: str) -> str:
    families = router_families(pool)
    running = [
        s for s in pool.states.values() if s.status in RUNNING and s.child is not None and not s.stopping
    ]
    texts = await asyncio.gather(*(scrape(client, secret, s) for s in running))
    for state, text in zip(running, texts, strict=True):
        if text is not None:
            add_exposition(families, text, state.id)
    return render(families)
