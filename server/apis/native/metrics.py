"""/metrics: Prometheus text with llama-server's llamacpp:* metric names."""

from __future__ import annotations

from quart import Blueprint, Response

from server.http import errors
from server.model.host import current_model

bp = Blueprint("metrics", __name__)


def _family(name: str, kind: str, help_text: str, value: float) -> str:
    return f"# HELP llamacpp:{name} {help_text}\n# TYPE llamacpp:{name} {kind}\nllamacpp:{name} {value}\n"


@bp.get("/metrics")
async def metrics() -> Response:
    model = current_model()
    if not model.settings.metrics:
        raise errors.not_supported("This server does not support metrics endpoint.")
    engine = model.snapshot()
    c = model.counters
    prompt_tps = c.prompt_tokens_total / c.prompt_seconds_total if c.prompt_seconds_total else 0.0
    gen_tps = (
        c.tokens_predicted_total / c.tokens_predicted_seconds_total
        if c.tokens_predicted_seconds_total
        else 0.0
    )
    families = [
        ("prompt_tokens_total", "counter", "Number of prompt tokens processed.", c.prompt_tokens_total),
        ("prompt_seconds_total", "counter", "Prompt process time", c.prompt_seconds_total),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            c.tokens_predicted_total,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time",
            c.tokens_predicted_seconds_total,
        ),
        (
            "prompt_tokens_cached_total",
            "counter",
            "Number of prompt tokens reused from the cache.",
            c.prompt_tokens_cached_total,
        ),
        ("n_decode_total", "counter", "Total number of llama_decode() calls", engine.n_steps),
        ("n_drafted_total", "counter", "Number of speculative tokens drafted.", c.drafted_total),
        (
            "n_drafted_accepted_total",
            "counter",
            "Number of speculative tokens accepted.",
            c.drafted_accepted_total,
        ),
        ("prompt_tokens_seconds", "gauge", "Average prompt throughput in tokens/s.", prompt_tps),
        ("predicted_tokens_seconds", "gauge", "Average generation throughput in tokens/s.", gen_tps),
        ("requests_processing", "gauge", "Number of requests processing.", engine.n_busy),
        ("requests_deferred", "gauge", "Number of requests deferred.", engine.n_waiting),
    ]
    text = "".join(_family(*f) for f in families)
    return Response(text, content_type="text/plain; version=0.0.4")
