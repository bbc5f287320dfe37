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


def test_llama_server_families_with_its_names_types_and_throughput_window() -> None:
    """llama-server's llamacpp:* lines as it writes them (n_tokens_max a counter without `_total`), its
    rates over decode steps (a generation's first token is free), and the gauges' window: each scrape
    reports what ran since the one before (a second scrape with nothing run reports 0)."""
    counters = Counters()
    for n, ms in ((1, 0.01), (16, 300.0)):
        counters.record(
            TokenEvent(text="", finish_reason="stop", timings=Timings(3, 8, 40.0, n, ms, 4, 3, 2))
        )
    engine = EngineSnapshot(n_steps=10, n_busy_slot_steps=15)
    first = exposition(counters, engine).decode()
    lines = first.splitlines()
    for name, kind, value in (
        ("prompt_tokens_total", "counter", 16.0),
        ("prompt_tokens_cached_total", "counter", 6.0),
        ("tokens_predicted_total", "counter", 17.0),
        ("n_decode_total", "counter", 10.0),
        ("n_tokens_max", "counter", 27.0),  # cache_n + prompt_n + predicted_n of the longer one
        ("spec_decode_num_draft_tokens_total", "counter", 8.0),
        ("spec_decode_num_accepted_tokens_total", "counter", 6.0),
        ("spec_decode_num_drafts_total", "counter", 4.0),
        ("n_busy_slots_per_decode", "gauge", 1.5),
    ):
        assert f"# TYPE llamacpp:{name} {kind}" in lines and f"llamacpp:{name} {value}" in lines, name
        assert any(line.startswith(f"# HELP llamacpp:{name} ") for line in lines)
    _, samples = parsed(first)
    assert samples[("llamacpp:predicted_tokens_seconds", frozenset())] == pytest.approx(15 / 0.30001)
    assert samples[("llamacpp:prompt_tokens_seconds", frozenset())] == pytest.approx(16 / 0.08)
    _, again = parsed(exposition(counters, engine).decode())
    assert again[("llamacpp:predicted_tokens_seconds", frozenset())] == 0
    assert again[("llamacpp:prompt_tokens_seconds", frozenset())] == 0
    assert again[("llamacpp:tokens_predicted_total", frozenset())] == 17  # the totals stay


def test_timings_rates_leave_out_the_first_token() -> None:
    """llama-server's timings: the first token comes from the prompt's last batch, so the generation
    rate is over predicted_n - 1 decode steps (0 for a single token)."""
    one = Timings(0, 8, 10.0, 1, 0.002).as_dict()
    assert one["predicted_per_second"] == 0.0 and one["predicted_per_token_ms"] == 0.0
    many = Timings(0, 8, 10.0, 16, 30.0).as_dict()
    assert many["predicted_per_second"] == pytest.approx(1e3 / 30.0 * 15)
    assert many["predicted_per_token_ms"] == pytest.approx(30.0 / 15)


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
