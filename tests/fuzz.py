"""The fuzzers of issue #20, shared by the fast and the slow tests: schemathesis over /openapi.json, random
and malformed byte bodies on every POST route, malformed SSE resume offsets. Each case's reply must be
below 500 (a 503 only with Retry-After), come within HANG_S, and an error must have its route's shape."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import httpx

from server.apis.openapi.document import ROUTES

HANG_S = 60.0  # a reply (or, for a stream, its first bytes) later than this is a hang
STREAM_BYTES = 4096  # of a 200 stream, this much is read, then the client goes away


@dataclass
class FuzzReport:
    cases: int = 0
    failures: list[str] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # operations/modes schemathesis could not generate

    def __add__(self, other: FuzzReport) -> FuzzReport:
        statuses = dict(self.statuses)
        for status, n in other.statuses.items():
            statuses[status] = statuses.get(status, 0) + n
        failures, skipped = self.failures + other.failures, self.skipped + other.skipped
        return FuzzReport(self.cases + other.cases, failures, statuses, skipped)

    def record(self, what: str, status: int | None, problem: str = "") -> None:
        self.cases += 1
        if status is not None:
            self.statuses[status] = self.statuses.get(status, 0) + 1
        if problem:
            self.failures.append(f"{what}: {problem}")


def reply_problem(path: str, status: int, headers: httpx.Headers, body: bytes) -> str:
    """What is wrong with a reply ("" when nothing is)."""
    if status >= 500 and not (status == 503 and "retry-after" in headers) and status != 501:
        return f"{status} {body[:300]!r}"
    if 400 <= status < 500 and status != 404:
        try:
            error = json.loads(body)
        except ValueError:
            return f"{status} with a body that is not JSON: {body[:200]!r}"
        anthropic = path.startswith("/v1/messages")
        if path.startswith("/api/"):  # Ollama's: {"error": "message"}
            ok = isinstance(error, dict) and isinstance(error.get("error"), str)
        elif anthropic:
            ok = error.get("type") == "error" and {"type", "message"} <= set(error.get("error", {}))
        else:
            ok = {"code", "message", "type"} <= set(error.get("error", {}))
        if not ok:
            return f"{status} not in the route's error shape: {body[:200]!r}"
    return ""


def send(
    client: httpx.Client,
    method: str,
    url: str,
    report: FuzzReport,
    what: str,
    path: str = "",
    **kwargs: object,
) -> int | None:
    """One request, read to its end (a stream: its first STREAM_BYTES), checked into `report`; `path`
    (default: `url`) decides the error shape."""
    path = path or url
    try:
        with client.stream(method, url, **kwargs) as reply:  # type: ignore[arg-type]
            body = b""
            for part in reply.iter_bytes():
                body += part
                if len(body) >= STREAM_BYTES and reply.headers.get("content-type", "").startswith(
                    ("text/event", "application/x-ndjson")
                ):
                    break
            report.record(
                what, reply.status_code, reply_problem(path, reply.status_code, reply.headers, body)
            )
            return reply.status_code
    except httpx.TimeoutException:
        report.record(what, None, f"no reply within {HANG_S} s (hang)")
    except httpx.HTTPError as exc:
        report.record(what, None, f"transport error {type(exc).__name__}: {exc}")
    return None


# -- random and malformed bodies ----------------------------------------------------------------------
VALID = (
    b'{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}',
    b'{"prompt": "Hello", "n_predict": 2}',
    b'{"content": "Hello world"}',
    b'{"tokens": [1, 2, 3]}',
    b'{"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}',
    b'{"input": "Hi", "max_output_tokens": 2}',
    b'{"input_prefix": "def f(", "input_suffix": ")", "n_predict": 2}',
    b'{"conversation_ids": ["a"]}',
)
TYPES = ("application/json", "", "text/plain", "application/octet-stream", "multipart/form-data; boundary=x")


def post_paths() -> list[str]:
    return [
        path.replace("{id_slot}", "0").replace("{response_id}", "resp_x")
        for route in ROUTES
        if route.method == "post"
        for path in route.paths
    ]


def random_body(rng: random.Random) -> bytes:
    """Random bytes, or a valid body mutated: bytes flipped, cut short, invalid UTF-8 or a non-finite
    number spliced in, nested deep, keys repeated."""
    base = rng.choice(VALID)
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 2000))
    if kind == 1:
        raw = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        return bytes(raw)
    if kind == 2:
        return base[: rng.randrange(len(base))]
    if kind == 3:
        at = base.index(b'"', 2) + 1
        return (
            base[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\\ud800", b"\x00"]) + base[at:]
        )
    if kind == 4:
        number = rng.choice([b"NaN", b"Infinity", b"-Infinity", b"1e999", b"9" * 5000, b"-0", b"1" * 30])
        return base[:-1] + b', "n_probs": ' + number + b', "max_tokens": ' + number + b"}"
    if kind == 5:
        depth = rng.choice([50, 200, 3000])
        return base[:-1] + b', "x": ' + b"[" * depth + b"]" * depth + b"}"
    if kind == 6:
        return base[:-1] + b", " + base[1:]  # every key twice
    return json.dumps(rng.choice([None, 1, "x", [], [1], {"a": {}}, True])).encode()


def fuzz_random_bodies(base_url: str, count: int, seed: int) -> FuzzReport:
    rng = random.Random(seed)
    report = FuzzReport()
    paths = post_paths()
    with httpx.Client(base_url=base_url, timeout=HANG_S) as client:
        for i in range(count):
            path = rng.choice(paths)
            ctype = rng.choice(TYPES)
            headers = {"Content-Type": ctype} if ctype else {}
            send(
                client, "POST", path, report, f"bytes #{i} {path}", content=random_body(rng), headers=headers
            )
    return report


# -- malformed SSE resume offsets ---------------------------------------------------------------------
OFFSETS = ("", "0", "-1", "1.5", "0x10", "abc", "9" * 40, "１２", " 3", "3 ", "%00", "1e3", "+1", "٣")


def fuzz_resume_offsets(base_url: str, count: int, seed: int) -> FuzzReport:
    """GET /v1/stream (and a background response's starting_after) with odd offsets, on a live
    session, a finished one and an unknown id."""
    rng = random.Random(seed)
    report = FuzzReport()
    with httpx.Client(base_url=base_url, timeout=HANG_S) as client:
        conv = f"fuzz-{seed}"
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "stream": True}
        with client.stream(
            "POST", "/v1/chat/completions", json=body, headers={"X-Conversation-Id": conv}
        ) as r:
            first = next(r.iter_bytes(), b"")
        for i in range(count):
            offset = rng.choice([*OFFSETS, str(rng.randrange(-5, 10_000)), str(len(first))])
            params = {"conv_id": rng.choice([conv, "nope", ""]), "from": offset}
            send(client, "GET", "/v1/stream", report, f"resume #{i} {params}", params=params)
            query = {"stream": "true", "starting_after": offset}
            send(client, "GET", "/v1/responses/resp_nope", report, f"responses #{i} {query}", params=query)
    return report


FIRST_PATHS = {route.paths[0] for route in ROUTES}


# -- schemathesis over /openapi.json ------------------------------------------------------------------
def fuzz_openapi(base_url: str, examples: int, seed: int, aliases: bool = True) -> FuzzReport:
    """Up to `examples` cases per operation (half valid, half invalid by schemathesis' negative mode),
    each sent with httpx (a stream read to STREAM_BYTES, then dropped); without `aliases`, only each
    route's first path."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    report = FuzzReport()
    with httpx.Client(base_url=base_url, timeout=HANG_S) as client:
        for result in schema.get_all_operations():
            operation = result.ok()
            if not aliases and operation.path not in FIRST_PATHS:
                continue
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                label = f"{operation.method.upper()} {operation.path} {mode.value}"
                try:
                    fuzz_operation(
                        client,
                        operation.as_strategy(generation_mode=mode),
                        label,
                        examples // 2,
                        seed,
                        report,
                    )
                except Exception as exc:  # noqa: BLE001 - a case schemathesis cannot build is not a server fault
                    report.skipped.append(f"{label}: {type(exc).__name__}: {str(exc)[:200]}")
    return report


def fuzz_operation(
    client: httpx.Client, strategy: object, label: str, examples: int, seed: int, report: FuzzReport
) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    @hypothesis_seed(seed)
    @settings(
        max_examples=max(1, examples),
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def run(case: object) -> None:
        send_case(client, case, report, label)

    run()


def send_case(client: httpx.Client, case: object, report: FuzzReport, label: str) -> None:
    kwargs = case.as_transport_kwargs(base_url=str(client.base_url).rstrip("/"))  # type: ignore[attr-defined]
    headers = {str(k): str(v) for k, v in (kwargs.get("headers") or {}).items()}
    body: dict[str, object] = {}
    if "json" in kwargs:
        try:
            body["content"] = json.dumps(kwargs["json"]).encode()  # NaN and Infinity as Python writes them
        except (TypeError, ValueError):
            body["content"] = repr(kwargs["json"]).encode()
    elif kwargs.get("data") is not None:
        data = kwargs["data"]
        body["content"] = data if isinstance(data, bytes) else str(data).encode()
    path = case.formatted_path  # type: ignore[attr-defined]
    what = f"{label} {str(body.get('content', b''))[:200]}"
    send(client, kwargs["method"], kwargs["url"], report, what, path=path, params=kwargs.get("params"),
         headers=headers, **body)  # fmt: skip
