"""/metrics: Prometheus text with llama-server's llamacpp:* metric names and Llamba's latency histograms
(server/model/metrics.py makes the page)."""

from __future__ import annotations

from quart import Blueprint, Response

from server.http import errors
from server.model.host import current_model
from server.model.metrics import CONTENT_TYPE, exposition

bp = Blueprint("metrics", __name__)


@bp.get("/metrics")
async def metrics() -> Response:
    model = current_model()
    if not model.settings.metrics:
        raise errors.not_supported("This server does not support metrics endpoint.")
    return Response(exposition(model.counters, model.snapshot()), content_type=CONTENT_TYPE)
