"""The router's `/metrics` (Prometheus text format): its own counters per model, then every running
child's own `/metrics` (llama-server's `llamacpp:*` families), each sample labelled `model="<id>"`, one
HELP/TYPE head per family. `/metrics?model=<id>` is proxied to that child instead, as llama-server's
router does (it has no aggregate)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass, field

from server.router.pool import ModelPool
from server.router.state import RUNNING, ModelState
from server.router.upstream import UpstreamClient, UpstreamError

CONTENT_TYPE = "text/plain; version=0.0.4"
SCRAPE_TIMEOUT_S = 5.0  # a child that does not answer in time is left out of this scrape
METRIC_NAME = re.compile(r"[^{\s]+")

Value = Callable[[ModelState, ModelPool], float]
ROUTER_FAMILIES: tuple[tuple[str, str, str, Value], ...] = (
    ("requests_total", "counter", "Requests forwarded to the model.", lambda s, p: s.requests),
    ("requests_in_flight", "gauge", "Requests being forwarded to the model now.", lambda s, p: s.in_flight),
    ("requests_queued", "gauge", "Requests waiting for the model's load or room.", lambda s, p: p.queued(s)),
    ("loads_total", "counter", "Times the model's child was started.", lambda s, p: s.loads),
    ("failures_total", "counter", "Failed loads and crashes of the model's child.", lambda s, p: s.failures),
    ("evictions_total", "counter", "Unloads to make room for another model.", lambda s, p: s.evictions),
)


@dataclass
class Family:
    kind: str = "untyped"
    help: str = ""
    samples: list[str] = field(default_factory=list)


def label_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def labelled(sample: str, model: str, **extra: str) -> str:
    """A sample line with `model="<id>"` (then `extra`'s labels, e.g. a cluster's `replica`) first."""
    name = METRIC_NAME.match(sample)
    end = name.end() if name else 0
    label = ",".join(f'{k}="{label_value(v)}"' for k, v in {"model": model, **extra}.items())
    if sample[end : end + 1] == "{":
        rest = sample[end + 1 :]
        return f"{sample[:end]}{{{label}{'' if rest.startswith('}') else ','}{rest}"
    return f"{sample[:end]}{{{label}}}{sample[end:]}"


def add_exposition(families: dict[str, Family], text: str, model: str, **extra: str) -> None:
    """One child's metrics into `families`, its samples labelled with its model (and `extra`)."""
    current: Family | None = None
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            _, what, name, *rest = line.split(" ", 3)
            current = families.setdefault(name, Family())
            if what == "HELP":
                current.help = rest[0] if rest else ""
            else:
                current.kind = rest[0] if rest else "untyped"
        elif line.strip() and not line.startswith("#"):
            if current is None:  # a sample without a head: its own untyped family
                name = METRIC_NAME.match(line)
                current = families.setdefault(name[0] if name else "", Family())
            current.samples.append(labelled(line, model, **extra))


def router_families(pool: ModelPool) -> dict[str, Family]:
    families: dict[str, Family] = {}
    for suffix, kind, help_text, value in ROUTER_FAMILIES:
        family = families.setdefault(f"llamba:router_{suffix}", Family(kind, help_text))
        for state in pool.states.values():
            family.samples.append(labelled(f"llamba:router_{suffix} {value(state, pool)}", state.id))
    status = families.setdefault(
        "llamba:router_model_status", Family("gauge", "1 for the model's status now (unloaded, loading...).")
    )
    for state in pool.states.values():
        status.samples.append(
            f'llamba:router_model_status{{model="{label_value(state.id)}",status="{state.status}"}} 1'
        )
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


def render(families: dict[str, Family]) -> str:
    lines: list[str] = []
    for name, family in families.items():
        if family.help:
            lines.append(f"# HELP {name} {family.help}")
        lines.append(f"# TYPE {name} {family.kind}")
        lines.extend(family.samples)
    return "\n".join(lines) + "\n"


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
