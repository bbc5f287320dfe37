"""/metrics: Prometheus text with llama-server's llamacpp:* metric names and Llamba's latency histograms
(server/model/metrics.py makes the page). Its `Process-Start-Time-Unix` header, as llama-server's,
says when the model's server started (Unix seconds): a scraper sees a restart, i.e. counters that began
again. (The name goes out lower-case, as every header of an ASGI server: HTTP names are case-insensitive.)"""

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
    page = exposition(model.counters, model.snapshot())
    started = str(int(model.counters.started))
    return Response(page, content_type=CONTENT_TYPE, headers={"Process-Start-Time-Unix": started})
