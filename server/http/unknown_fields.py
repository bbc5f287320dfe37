"""Request fields no schema of Llamba's reads, treated as llama-server treats them: accepted and ignored.

llama-server reads the keys it knows (`json_value`) and never refuses one it does not, so its own clients
send fields of newer or older versions (a KV-session library's `return_tokens`, an integration's
`n_probs` on chat) and expect an answer. Here such a field is ignored too, named once per process in the
log (`request.unknown_field`, warning level) and counted in `/metrics` (`llamba:unknown_fields_total`,
labelled by field). `--strict-fields` keeps the old refusal: a 400 naming each one.

The switch is read per request from a context variable that the app sets before each request
(`install`); outside a request (a journaled stream run again at start-up) fields are accepted.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextvars import ContextVar

import structlog
from prometheus_client import Counter
from prometheus_client.metrics_core import Metric
from quart import Quart

log = structlog.get_logger()

# A client picks the names: past this many distinct ones, the rest share one label and one warning, so
# neither the log nor the metric grows without bound.
MAX_NAMES = 256
OTHER = "_other"
MAX_NAME_LENGTH = 64

_strict: ContextVar[bool] = ContextVar("llamba_strict_fields", default=False)


class UnknownFields:
    """The process's record of unknown fields: the names warned about, and the counter."""

    def __init__(self) -> None:
        self.named: set[str] = set()
        self.counter = Counter(
            "llamba:unknown_fields",
            "Request fields Llamba does not know, accepted and ignored (as llama-server).",
            ["field"],
            registry=None,
        )

    def note(self, name: str) -> None:
        """One request's unknown field: warned the first time its name is seen, counted every time."""
        label = name[:MAX_NAME_LENGTH]
        if label not in self.named:
            label = OTHER if len(self.named) >= MAX_NAMES else label
            if label not in self.named:
                self.named.add(label)
                log.warning("request.unknown_field", field=label, action="ignored (--strict-fields: 400)")
        self.counter.labels(field=label).inc()

    def collect(self) -> Iterator[Metric]:
        """The counter's family without prometheus_client's `_created` samples (as the histograms')."""
        for family in self.counter.collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


UNKNOWN_FIELDS = UnknownFields()


def refused(names: Iterable[str]) -> list[str]:
    """What the request's unknown fields come to: with --strict-fields one problem per field (the caller
    answers 400 naming them); else none, each field noted and left out."""
    names = list(names)
    if _strict.get():
        return [f"'{name}': unknown field" for name in names]
    for name in names:
        UNKNOWN_FIELDS.note(name)
    return []


def install(app: Quart, strict: bool) -> None:
    """Every request of `app` reads unknown fields under `strict` (--strict-fields)."""

    async def set_policy() -> None:  # async: Quart runs a sync hook in a thread, another context
        _strict.set(strict)

    app.before_request(set_policy)
