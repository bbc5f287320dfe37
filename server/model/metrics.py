"""What a model server's `/metrics` reports, as Prometheus text made by prometheus_client's exposition:
llama-server's `llamacpp:*` counters and gauges (values from `Counters` and the engine's snapshot, built
per scrape as a custom collector does), then Llamba's latency histograms, one observation per generation:

- `llamba:time_to_first_token_seconds`: from the submit to the first generated token read here;
- `llamba:inter_token_latency_seconds`: the gap between consecutive tokens read here (one per gap);
- `llamba:request_queue_time_seconds`: from the submit until the engine started the prompt, that is the
  first prompt-progress event's arrival less the engine's `time_ms` in it, else the first token's
  arrival less the engine's `prompt_ms` (engine/sequence.py starts both clocks when a slot takes the
  request; `time.perf_counter` is the one clock of both threads);
- `llamba:e2e_request_latency_seconds`: from the submit to the final event;
- `llamba:request_prompt_tokens` and `llamba:request_generation_tokens`: the final `timings`'
  `prompt_n + cache_n` (the whole prompt, as `usage.prompt_tokens`) and `predicted_n`.

So per request TTFT = queue + prompt_ms (without progress events) and TTFT + the gaps = e2e. The names,
and the bucket bounds, are vLLM's (vllm/v1/metrics/loggers.py: TTFT, time per output token, request
latency, and the 1-2-5 series for token counts, here up to 10^6 since the histograms outlive a load).
Times are read where the event loop reads the events, i.e. what a client waits for, not the engine's
step times. Each `n` choice is one request; embeddings are not generations and are not observed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import Histogram
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from engine.api import EngineSnapshot, TokenEvent
from server.http.unknown_fields import UNKNOWN_FIELDS

CONTENT_TYPE = "text/plain; version=0.0.4"

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)  # fmt: skip
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
TOKEN_BUCKETS = tuple(float(m * 10**e) for e in range(7) for m in (1, 2, 5) if m * 10**e <= 1_000_000)


@dataclass
class Bucket:
    """Tokens, decode steps and seconds of a window: llama-server's rates divide steps by time (a
    generation's first token is free: it comes from the prompt's last batch)."""

    n: int = 0
    steps: int = 0
    seconds: float = 0.0

    def add(self, n: int, steps: int, seconds: float) -> None:
        self.n, self.steps, self.seconds = self.n + n, self.steps + steps, self.seconds + seconds

    def per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Counters:
    """What /metrics reports: llama-server's llamacpp:* totals, and the latency histograms. Kept by the
    model's host across sleeps."""

    prompt: Bucket = field(default_factory=Bucket)  # processed prompt tokens (cached ones apart)
    predicted: Bucket = field(default_factory=Bucket)
    # The throughput gauges' window: what ran since the last scrape (each scrape empties it, as
    # llama-server's `reset_bucket`), so a scrape while asleep reports the last work once, then 0.
    prompt_window: Bucket = field(default_factory=Bucket)
    predicted_window: Bucket = field(default_factory=Bucket)
    prompt_tokens_cached_total: int = 0
    n_tokens_max: int = 0  # the longest sequence seen (prompt and generation)
    drafted_total: int = 0  # speculative tokens verified
    drafted_accepted_total: int = 0
    draft_steps_total: int = 0
    requests_total: int = 0
    started: float = field(default_factory=time.time)
    latency: Latency = field(default_factory=lambda: Latency())

    @property
    def prompt_tokens_total(self) -> int:
        return self.prompt.n

    @property
    def tokens_predicted_total(self) -> int:
        return self.predicted.n

    def record(self, event: TokenEvent) -> None:
        t = event.timings
        if t is None:
            return
        prompt_s, predicted_s = t.prompt_ms / 1e3, t.predicted_ms / 1e3
        for bucket in (self.prompt, self.prompt_window):
            bucket.add(t.prompt_n, t.prompt_n, prompt_s)
        for bucket in (self.predicted, self.predicted_window):
            bucket.add(t.predicted_n, t.predicted_steps, predicted_s)
        self.prompt_tokens_cached_total += t.cache_n
        self.n_tokens_max = max(self.n_tokens_max, t.cache_n + t.prompt_n + t.predicted_n)
        self.drafted_total += t.draft_n
        self.drafted_accepted_total += t.draft_n_accepted
        self.draft_steps_total += t.draft_steps

    def take_rates(self) -> tuple[float, float]:
        """The window's prompt and generation throughput (tokens/s); the window starts again."""
        rates = (self.prompt_window.per_second(), self.predicted_window.per_second())
        self.prompt_window, self.predicted_window = Bucket(), Bucket()
        return rates


class Latency:
    """The per-request histograms (prometheus_client's, in no registry: the page collects them)."""

    def __init__(self) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"llamba:{name}", doc, buckets=buckets, registry=None)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between two generated tokens.", ITL_BUCKETS)
        self.queue = histogram(
            "request_queue_time_seconds", "Time a request waited before its prompt started.", REQUEST_BUCKETS
        )
        self.e2e = histogram(
            "e2e_request_latency_seconds", "Time from submit to the last event.", REQUEST_BUCKETS
        )
        self.prompt = histogram("request_prompt_tokens", "Prompt tokens of a request.", TOKEN_BUCKETS)
        self.generated = histogram("request_generation_tokens", "Tokens a request generated.", TOKEN_BUCKETS)

    def collect(self) -> Iterator[Metric]:
        """Every histogram's family, without prometheus_client's `_created` series (a process's start
        time per family: noise here, and a router's merge would carry it for each child)."""
        for h in (self.ttft, self.itl, self.queue, self.e2e, self.prompt, self.generated):
            for family in h.collect():
                family.samples = [s for s in family.samples if not s.name.endswith("_created")]
                yield family


class RequestTimer:
    """One generation's clock, read where its events are read (EngineClient); `finish` observes it."""

    def __init__(self, latency: Latency) -> None:
        self.latency = latency
        self.submitted = time.perf_counter()  # before the engine sees the request
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.queue: float | None = None

    def see(self, event: TokenEvent) -> float:
        """Note the event's arrival; when it was."""
        now = time.perf_counter()
        if self.queue is None and event.progress is not None:
            self.queue = now - self.submitted - event.progress.time_ms / 1e3
        if event.token is None:
            return now
        if self.first_token is None:
            self.first_token = now
        elif self.last_token is not None:
            self.latency.itl.observe(now - self.last_token)
        self.last_token = now
        return now

    def finish(self, event: TokenEvent) -> None:
        """The final event's observations; its `timings` carry the prompt's and generation's size."""
        end = self.see(event)
        latency, t = self.latency, event.timings
        latency.e2e.observe(end - self.submitted)
        if self.first_token is not None:
            latency.ttft.observe(self.first_token - self.submitted)
        if t is None:
            return
        if self.queue is None and self.first_token is not None and t.prompt_ms > 0:
            self.queue = self.first_token - self.submitted - t.prompt_ms / 1e3
        if self.queue is not None:
            latency.queue.observe(max(self.queue, 0.0))
        latency.prompt.observe(t.prompt_n + t.cache_n)
        latency.generated.observe(t.predicted_n)


Value = tuple[str, str, str, float]

# llama-server's families, in its order: name (without `llamacpp:`), kind, help.
LLAMACPP_FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("prompt_tokens_total", "counter", "Number of prompt tokens processed, excluding cached tokens"),
    ("prompt_tokens_cached_total", "counter", "Number of prompt tokens reused from the cache"),
    ("prompt_seconds_total", "counter", "Total time spent processing prompts"),
    ("tokens_predicted_total", "counter", "Number of generation tokens processed"),
    ("tokens_predicted_seconds_total", "counter", "Total time spent generating tokens"),
    (
        "n_decode_total",
        "counter",
        "Total number of llama_decode() calls, excluding speculative decoding and multimodal decoding",
    ),
    ("n_tokens_max", "counter", "Largest observed sequence length (prompt + generation)"),
    ("spec_decode_num_draft_tokens_total", "counter", "Speculative: Total draft tokens generated"),
    (
        "spec_decode_num_accepted_tokens_total",
        "counter",
        "Speculative: Total draft tokens accepted by the target model",
    ),
    ("spec_decode_num_drafts_total", "counter", "Speculative: Total speculative decoding verification steps"),
    ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s"),
    ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s"),
    ("requests_processing", "gauge", "Number of requests processing"),
    ("requests_deferred", "gauge", "Number of requests deferred"),
    ("n_busy_slots_per_decode", "gauge", "Average number of busy slots per llama_decode() call"),
)


def llamacpp_values(c: Counters, engine: EngineSnapshot) -> list[Value]:
    """llama-server's families with their values: (name, kind, help, value). Reading them takes the
    throughput window (see Counters)."""
    prompt_tps, gen_tps = c.take_rates()
    values = (
        c.prompt.n,
        c.prompt_tokens_cached_total,
        c.prompt.seconds,
        c.predicted.n,
        c.predicted.seconds,
        engine.n_steps,
        c.n_tokens_max,
        c.drafted_total,
        c.drafted_accepted_total,
        c.draft_steps_total,
        prompt_tps,
        gen_tps,
        engine.n_busy,
        engine.n_waiting,
        engine.n_busy_slot_steps / max(engine.n_steps, 1),
    )
    return [(*family, value) for family, value in zip(LLAMACPP_FAMILIES, values, strict=True)]


@dataclass(frozen=True)
class Page:
    """Metric families as prometheus_client's exposition collects them (anything with `collect`)."""

    families: Iterable[Metric]

    def collect(self) -> Iterable[Metric]:
        return self.families


def llamacpp_text(counters: Counters, engine: EngineSnapshot) -> str:
    """llama-server's own lines, written as it writes them: every family under its full name, so
    `n_tokens_max` is a counter without `_total` (prometheus_client's exposition would add one)."""
    lines = []
    for name, kind, help_text, value in llamacpp_values(counters, engine):
        full = f"llamacpp:{name}"
        lines += [f"# HELP {full} {help_text}", f"# TYPE {full} {kind}", f"{full} {floatToGoString(value)}"]
    return "\n".join(lines) + "\n"


def exposition(counters: Counters, engine: EngineSnapshot) -> bytes:
    """The whole /metrics page: llamacpp:* first (as llama-server orders them), then the histograms and
    the unknown request fields' counter (server/http/unknown_fields.py). A scrape starts the throughput
    gauges' window again."""
    families = [*counters.latency.collect(), *UNKNOWN_FIELDS.collect()]
    histograms = generate_latest(Page(families))
    return llamacpp_text(counters, engine).encode() + histograms
