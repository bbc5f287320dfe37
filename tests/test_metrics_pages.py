"""The /metrics pages without servers: a model server's page made from real engine events (the types the
engine hands over), merged as a router and a cluster router merge their children's pages, and the
cluster's own families; each page parsed whole by prometheus_client (the end-to-end checks, with real
servers, are tests/test_metrics_server.py's)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.api import EngineSnapshot, PromptProgress, Timings, TokenEvent
from server.cluster.autoscale import ScalePolicy
from server.cluster.fleet import Fleet
from server.cluster.metrics import cluster_families
from server.cluster.placement import READY, Replica
from server.model.metrics import Counters, RequestTimer, exposition
from server.router.metrics import add_exposition, render

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parsed(text: str) -> tuple[dict[str, str], Samples]:
    kinds: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        assert family.name not in kinds, f"two heads for {family.name}"
        kinds[family.name] = family.type
        samples.update({(s.name, frozenset(s.labels.items())): s.value for s in family.samples})
    return kinds, samples


def model_page(generated: list[int], progress: bool = False) -> str:
    """A model server's page after one generation per entry of `generated` (its token count)."""
    counters = Counters()
    for n in generated:
        timer = RequestTimer(counters.latency)
        if progress:
            timer.see(TokenEvent(text="", progress=PromptProgress(10, 0, 10, 1.0)))
        for token in range(n - 1):
            timer.see(TokenEvent(text="x", token=token))
        final = TokenEvent(text="", token=n, finish_reason="stop", timings=Timings(2, 8, 0.5, n, 1.5))
        counters.record(final)
        timer.finish(final)
    return exposition(counters, EngineSnapshot()).decode()


def without(samples: Samples, *labels: str) -> Samples:
    """`samples` with `labels` taken off (what a child's page had before the merge labelled it)."""
    return {
        (name, frozenset((k, v) for k, v in key if k not in labels)): v for (name, key), v in samples.items()
    }


def test_a_model_page_counts_each_generation() -> None:
    kinds, samples = parsed(model_page([3, 1, 5], progress=True))
    assert kinds["llamacpp:tokens_predicted"] == "counter" and kinds["llamacpp:requests_deferred"] == "gauge"
    assert samples[("llamacpp:tokens_predicted_total", frozenset())] == 9
    for name in ("time_to_first_token_seconds", "request_queue_time_seconds", "e2e_request_latency_seconds"):
        assert kinds[f"llamba:{name}"] == "histogram"
        assert samples[(f"llamba:{name}_count", frozenset())] == 3
    assert samples[("llamba:inter_token_latency_seconds_count", frozenset())] == 2 + 0 + 4  # gaps
    assert samples[("llamba:request_generation_tokens_sum", frozenset())] == 9
    assert samples[("llamba:request_prompt_tokens_sum", frozenset())] == 3 * 10  # prompt_n + cache_n
    assert samples[("llamba:request_generation_tokens_bucket", frozenset({("le", "2.0")}))] == 1
    assert not any(name.endswith("_created") for name, _ in samples)


def test_merged_pages_keep_each_childs_histograms_under_its_labels() -> None:
    pages = {"a": model_page([4, 4]), "b": model_page([1, 2, 3])}
    families: dict = {}
    for model, text in pages.items():
        add_exposition(families, text, model, replica="0")
    add_exposition(families, "this is { not metrics", "c", replica="0")  # a garbled page is left out
    kinds, merged = parsed(render(families))
    assert kinds["llamba:e2e_request_latency_seconds"] == "histogram"
    for model, text in pages.items():
        mine = {k: v for k, v in merged.items() if ("model", model) in k[1]}
        assert without(mine, "model", "replica") == parsed(text)[1]  # every bucket, sum and count
        assert all(("replica", "0") in key for _, key in mine)
    assert not any(("model", "c") in key for _, key in merged)


@pytest.mark.anyio
async def test_the_cluster_page_labels_replicas_and_sorts_labels() -> None:
    async with httpx.AsyncClient() as client:
        fleet = Fleet("m", lambda: None, client, "secret", ScalePolicy(1, 2), initial=0)  # type: ignore[arg-type,return-value]
        fleet.replicas.extend([Replica(0, status=READY, served=3), Replica(1)])
        fleet.scaler.decisions["up"] += 1
        fleet.routing.placed["sticky"] += 2
        kinds, samples = parsed(render(cluster_families([fleet])))
        text = render(cluster_families([fleet]))
    assert kinds["llamba:cluster_requests"] == "counter" and kinds["llamba:cluster_replicas_up"] == "gauge"
    assert samples[("llamba:cluster_requests_total", frozenset({("model", "m"), ("replica", "0")}))] == 3
    assert samples[("llamba:cluster_replicas_up", frozenset({("model", "m")}))] == 1
    # prometheus_client's exposition writes labels sorted by name
    assert 'llamba:cluster_scale_decisions_total{action="up",model="m"} 1.0' in text.splitlines()
    assert 'llamba:cluster_placements_total{model="m",reason="sticky"} 2.0' in text.splitlines()
    assert text.count("# TYPE llamba:cluster_requests_total counter") == 1
