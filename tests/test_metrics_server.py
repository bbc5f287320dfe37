"""The latency histograms of `/metrics` end to end (server/model/metrics.py): real streamed chats on the
shared SmolLM2 server, then on a real router with two children; every page parsed whole by
prometheus_client's parser, and the histograms checked against the `timings` the replies carried."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server_process import ServerProcess, wait_until

HISTOGRAMS = (
    "llamba:time_to_first_token_seconds",
    "llamba:inter_token_latency_seconds",
    "llamba:request_queue_time_seconds",
    "llamba:e2e_request_latency_seconds",
    "llamba:request_prompt_tokens",
    "llamba:request_generation_tokens",
)
LLAMACPP = ("llamacpp:prompt_tokens", "llamacpp:tokens_predicted", "llamacpp:requests_processing")
ROUNDING = 1e-6  # seconds: float sums of a handful of observations, and JSON's round trip of timings
LOAD_S = 240.0


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def page(url: str, **params: str) -> tuple[dict[str, str], Samples]:
    """The whole /metrics page parsed by prometheus_client (a page it cannot parse fails here): each
    family's type, and every sample by (name, sorted labels)."""
    reply = httpx.get(url + "/metrics", params=params, timeout=30)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain"), reply.text
    kinds: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(reply.text):
        assert family.name not in kinds, f"two heads for {family.name}"
        kinds[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return kinds, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def histogram(samples: Samples, name: str, **labels: str) -> dict[str, float]:
    """One histogram's buckets (by `le`), `sum` and `count`; its buckets are checked cumulative and its
    +Inf bucket equal to its count."""
    buckets = {
        dict(key)["le"]: v
        for (sample, key), v in samples.items()
        if sample == name + "_bucket" and {k: v2 for k, v2 in key if k != "le"} == labels
    }
    ordered = [buckets[le] for le in sorted(buckets, key=float)]
    count = value(samples, name + "_count", **labels)
    assert ordered == sorted(ordered) and buckets.get("+Inf") == count, (name, labels, buckets, count)
    return {**buckets, "sum": value(samples, name + "_sum", **labels), "count": count}


def streamed_chat(url: str, content: str, model: str | None = None) -> tuple[dict[str, Any], float]:
    """A streamed chat's final `timings`, and the seconds the client waited from sending to the last
    chunk (an upper bound of the server's end-to-end time)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        **({"model": model} if model else {}),
    }
    timings: dict[str, Any] | None = None
    start = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=LOAD_S) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                timings = json.loads(line[6:]).get("timings", timings)
    waited = time.perf_counter() - start
    assert timings is not None, "no timings in the stream"
    return timings, waited


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before.get(k, 0.0) for k in after}


def test_histograms_count_each_streamed_request_and_agree_with_its_timings(server: ServerProcess) -> None:
    url = server.base_url
    kinds, before = page(url)
    assert all(kinds[h] == "histogram" for h in HISTOGRAMS)
    assert kinds["llamacpp:prompt_tokens"] == "counter" and kinds["llamacpp:requests_processing"] == "gauge"
    prompts = [f"Name a colour, number {i}." for i in range(4)]
    replies = [streamed_chat(url, p) for p in prompts]
    timings = [t for t, _ in replies]
    n = len(replies)
    _, after = page(url)
    h = {name: delta(histogram(after, name), histogram(before, name)) for name in HISTOGRAMS}
    ttft, itl, queue, e2e, prompt, generated = (h[name] for name in HISTOGRAMS)

    assert ttft["count"] == queue["count"] == e2e["count"] == prompt["count"] == generated["count"] == n
    assert itl["count"] == sum(t["predicted_n"] - 1 for t in timings)  # one per gap between tokens
    # The token counts are the replies' own: the whole prompt (processed + cached) and the generated.
    assert prompt["sum"] == sum(t["prompt_n"] + t["cache_n"] for t in timings)
    assert generated["sum"] == sum(t["predicted_n"] for t in timings)
    # Queue wait is the first token's wait less the engine's prompt time: with the replies' prompt_ms the
    # two sums agree; and the first token then the gaps between tokens make up the whole request.
    prompt_s = sum(t["prompt_ms"] for t in timings) / 1e3
    assert math.isclose(ttft["sum"] - queue["sum"], prompt_s, abs_tol=ROUNDING * n)
    assert math.isclose(ttft["sum"] + itl["sum"], e2e["sum"], abs_tol=ROUNDING * n)
    # Causality, the other way round: the engine's own time lies within the server's end-to-end time,
    # which lies within what the client waited.
    engine_s = sum(t["prompt_ms"] + t["predicted_ms"] for t in timings) / 1e3
    assert engine_s <= e2e["sum"] <= sum(w for _, w in replies)
    assert queue["sum"] >= 0 and all(v >= 0 for v in (*queue.values(), *itl.values()))


# -- through a router: each child's histograms labelled by its model ---------------------------------------
PRESET = """
version = 1
[*]
c = 1024
[smol-a]
model = smollm2
[smol-b]
model = smollm2
"""


@pytest.fixture
def router(tmp_path: Path) -> Iterator[ServerProcess]:
    preset = tmp_path / "models.ini"
    preset.write_text(PRESET)
    proc = ServerProcess("--models-preset", str(preset), "--metrics").wait_healthy()
    yield proc
    proc.stop()


def test_the_router_merges_each_childs_histograms_labelled_by_model(router: ServerProcess) -> None:
    url = router.base_url
    asked = {"smol-a": 3, "smol-b": 2}
    for model, n in asked.items():
        for i in range(n):
            streamed_chat(url, f"Say a word about {i}.", model)
    wait_until(lambda: _idle(url, list(asked)), 30, "the children's requests to end")
    kinds, merged = page(url)  # the router's whole page parses: its own families, then the children's
    assert kinds["llamba:router_requests"] == "counter" and kinds["llamba:router_model_status"] == "gauge"
    for model, n in asked.items():
        _, own = page(url, model=model)  # the child's own page (proxied), without labels
        for name in HISTOGRAMS:
            assert kinds[name] == "histogram"
            labelled = histogram(merged, name, model=model)
            assert labelled == histogram(own, name), (model, name)  # every bucket, the sum, the count
        assert histogram(merged, "llamba:e2e_request_latency_seconds", model=model)["count"] == n
        for name in LLAMACPP:
            suffix = "_total" if kinds[name] == "counter" else ""
            assert value(merged, name + suffix, model=model) == value(own, name + suffix)


def _idle(url: str, models: list[str]) -> bool:
    return all(value(page(url, model=m)[1], "llamacpp:requests_processing") == 0 for m in models)
