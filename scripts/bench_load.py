"""Load: many concurrent clients, each sending a mix of requests, against one server (issue #20).

Each of `--clients` clients sends `--requests` requests one after another, its kinds taken in turn
from MIX (offset by the client's number, so every kind runs at every moment): chat (whole and
streamed), /v1/completions, /tokenize, a resumable stream that drops its connection part-way and
resumes from the byte it had (GET /v1/stream?from=N), and a stream cancelled mid-way by its client.
Every request must end well: a 2xx (or a documented 4xx/503 with Retry-After), and every stream read
to its end must end with `data: [DONE]` or an error event. Reported: lost requests (a transport error,
a stream without its end), 5xx, p50/p95 latency per kind, and each generation's wait (its latency
less the prompt and generation time its `timings` report: queueing plus HTTP), with `uptime`'s load.

    .venv/bin/python scripts/bench_load.py            # starts SmolLM2 -np 4 itself
    .venv/bin/python scripts/bench_load.py --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_process import ServerProcess  # noqa: E402

MIX = ("chat", "chat_stream", "completion", "tokenize", "resume", "cancel", "chat_stream", "chat")
SERVER_FLAGS = ("-m", "smollm2", "-np", "4", "-c", "4096")
DONE = b"data: [DONE]"


@dataclass
class Outcome:
    kind: str
    status: int = 0
    seconds: float = 0.0
    compute_ms: float | None = None  # the prompt + generation time its `timings` report
    lost: str = ""  # why the request did not end well ("" when it did)

    @property
    def wait_ms(self) -> float | None:
        """Latency less the reported compute: queueing for a slot, tokenizing, HTTP."""
        return None if self.compute_ms is None else max(0.0, self.seconds * 1e3 - self.compute_ms)


@dataclass
class Report:
    clients: int
    requests: int
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    load: str = ""

    def summary(self) -> dict[str, Any]:
        lost = [o for o in self.outcomes if o.lost]
        kinds = sorted({o.kind for o in self.outcomes})
        waits = [o.wait_ms for o in self.outcomes if o.wait_ms is not None]
        return {
            "requests": len(self.outcomes),
            "expected": self.clients * self.requests,
            "lost": len(lost),
            "lost_examples": [asdict(o) for o in lost[:5]],
            "status_5xx": sum(o.status >= 500 and o.status != 503 for o in self.outcomes),
            "status_503": sum(o.status == 503 for o in self.outcomes),
            "latency_s": {k: percentiles([o.seconds for o in self.outcomes if o.kind == k]) for k in kinds}
            | {"all": percentiles([o.seconds for o in self.outcomes])},
            "wait_ms": percentiles(waits),
            "wall_s": round(self.wall_s, 1),
            "load_after": self.load,
        }


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {"p50": round(statistics.median(ordered), 3), "p95": round(p95, 3), "n": len(ordered)}


def chat_body(i: int, stream: bool, max_tokens: int) -> dict[str, Any]:
    content = f"Count from {i} to {i + 5} in words."
    return {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "stream": stream}


def last_timings(raw: bytes) -> dict[str, Any] | None:
    """The last `timings` object in an SSE body."""
    found = None
    for line in raw.split(b"\n"):
        if line.startswith(b"data: {") and b'"timings"' in line:
            found = json.loads(line[6:]).get("timings", found)
    return found


def stream_ended(raw: bytes) -> bool:
    """A stream ends with [DONE] or with an error event (`data: {"error": ...}` on OpenAI's routes and
    the native ones, server/http/sse.py; Anthropic's `event: error`)."""
    tail = raw.rstrip().rsplit(b"\n\n", 1)[-1]
    return tail.startswith(DONE) or b'"error"' in tail


class LoadClient:
    def __init__(self, http: httpx.AsyncClient, number: int, max_tokens: int) -> None:
        self.http, self.number, self.max_tokens = http, number, max_tokens

    async def run(self, kind: str, i: int) -> Outcome:
        out = Outcome(kind)
        start = time.perf_counter()
        try:
            await getattr(self, kind)(i, out)
        except (httpx.HTTPError, json.JSONDecodeError) as exc:
            out.lost = f"{type(exc).__name__}: {exc}"
        out.seconds = time.perf_counter() - start
        if out.status >= 500 and out.status != 503 and not out.lost:
            out.lost = f"status {out.status}"
        return out

    @staticmethod
    def _check(out: Outcome, reply: httpx.Response) -> bool:
        """True for a 2xx; a 503 must carry Retry-After; anything else is a lost request."""
        out.status = reply.status_code
        if reply.status_code == 503 and "retry-after" not in reply.headers:
            out.lost = "503 without Retry-After"
        elif not (reply.is_success or reply.status_code == 503):
            out.lost = f"status {reply.status_code}: {reply.text[:200]}"
        return reply.is_success

    async def chat(self, i: int, out: Outcome) -> None:
        reply = await self.http.post("/v1/chat/completions", json=chat_body(i, False, self.max_tokens))
        if self._check(out, reply):
            out.compute_ms = self._compute_ms(reply.json().get("timings"))

    async def completion(self, i: int, out: Outcome) -> None:
        body = {"prompt": f"The number {i} is", "max_tokens": self.max_tokens}
        reply = await self.http.post("/v1/completions", json=body)
        if self._check(out, reply):
            out.compute_ms = self._compute_ms(reply.json().get("timings"))

    async def tokenize(self, i: int, out: Outcome) -> None:
        reply = await self.http.post("/tokenize", json={"content": f"client {self.number} request {i}"})
        if self._check(out, reply) and not reply.json().get("tokens"):
            out.lost = "no tokens"

    async def chat_stream(self, i: int, out: Outcome) -> None:
        async with self.http.stream(
            "POST", "/v1/chat/completions", json=chat_body(i, True, self.max_tokens)
        ) as r:
            raw = b"".join([part async for part in r.aiter_bytes()])
            if self._check(out, r):
                if not stream_ended(raw):
                    out.lost = "stream without [DONE] or an error event"
                out.compute_ms = self._compute_ms(last_timings(raw))

    async def resume(self, i: int, out: Outcome) -> None:
        """A resumable stream whose connection drops after its first bytes; the rest is read from
        GET /v1/stream?from=<bytes read>, and the two parts must make a whole stream."""
        conv = f"load-{self.number}-{i}-{uuid.uuid4().hex[:6]}"
        headers = {"X-Conversation-Id": conv}
        body = chat_body(i, True, self.max_tokens)
        first = b""
        async with self.http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
            if not self._check(out, r):
                return
            async for part in r.aiter_bytes():
                first += part
                if b"\n\n" in first:
                    break  # the client goes away here
        async with self.http.stream("GET", "/v1/stream", params={"conv_id": conv, "from": len(first)}) as r:
            rest = b"".join([part async for part in r.aiter_bytes()])
            if not self._check(out, r):
                return
        whole = first + rest
        if not stream_ended(whole):
            out.lost = "resumed stream without [DONE] or an error event"
        out.compute_ms = self._compute_ms(last_timings(whole))

    async def cancel(self, i: int, out: Outcome) -> None:
        """A stream its client closes after the first content chunk (the generation must stop)."""
        body = chat_body(i, True, 4 * self.max_tokens)
        async with self.http.stream("POST", "/v1/chat/completions", json=body) as r:
            if not self._check(out, r):
                return
            seen = b""
            async for part in r.aiter_bytes():
                seen += part
                if b'"content":"' in seen or DONE in seen:
                    break

    @staticmethod
    def _compute_ms(timings: dict[str, Any] | None) -> float | None:
        """The prompt + generation time the server reports."""
        if not timings:
            return None
        return float(timings.get("prompt_ms", 0.0)) + float(timings.get("predicted_ms", 0.0))


async def client_loop(http: httpx.AsyncClient, number: int, requests: int, max_tokens: int) -> list[Outcome]:
    client = LoadClient(http, number, max_tokens)
    return [await client.run(MIX[(number + i) % len(MIX)], i) for i in range(requests)]


async def run_load(url: str, clients: int, requests: int, max_tokens: int = 16) -> Report:
    """`clients` concurrent clients x `requests` each against the server at `url`."""
    report = Report(clients, requests)
    limits = httpx.Limits(max_connections=clients * 2, max_keepalive_connections=clients * 2)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(client_loop(http, n, requests, max_tokens) for n in range(clients)))
        report.wall_s = time.perf_counter() - start
    report.outcomes = [o for batch in results for o in batch]
    report.load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="a running server (default: start SmolLM2 -np 4 here)")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    server = None if args.url else ServerProcess(*SERVER_FLAGS).wait_healthy(300)
    url = args.url or server.base_url  # type: ignore[union-attr]
    try:
        report = asyncio.run(run_load(url, args.clients, args.requests, args.max_tokens))
        healthy = httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(report.summary() | {"healthy_after": healthy}, indent=2))


if __name__ == "__main__":
    main()
