"""llama-server behaviour of the real server: native routes, batching, limits, auth, lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from engine.model_files import resolve
from server.app import create_app
from server.config.parse import parse_settings
from tests import protected_routes
from tests.server_process import LIVENESS_S, REPO, ServerProcess, slow_client, wait_until

# Liveness bound, not a speed check: after SIGTERM the server ends its generations, drains and exits by
# itself (code 0) within this time, well before stop()'s SIGKILL fallback would be needed.
SIGTERM_EXIT_S = LIVENESS_S
ECHO_MCP = REPO / "tests" / "mcp_servers" / "echo.py"


def chat_body(content: str, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": content}], "temperature": 0, **extra}


async def stream_text(client: httpx.AsyncClient, body: dict) -> tuple[str, int]:
    """The concatenated content of a streamed chat and its HTTP status."""
    text = ""
    async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
        return text, resp.status_code


def test_16_concurrent_streams_equal_their_solo_runs(server) -> None:  # type: ignore[no-untyped-def]
    bodies = [chat_body(f"Write one sentence about the number {i}.", max_tokens=24) for i in range(16)]

    async def run_all() -> list[tuple[str, int]]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=300) as client:
            return await asyncio.gather(*(stream_text(client, b) for b in bodies))

    together = asyncio.run(run_all())
    assert all(status == 200 for _, status in together)
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        for body, (text, _) in zip(bodies, together, strict=True):
            solo = client.post("/v1/chat/completions", json={**body, "cache_prompt": False}).json()
            assert solo["choices"][0]["message"]["content"] == text


def test_dropped_stream_frees_its_slot(server) -> None:  # type: ignore[no-untyped-def]
    body = chat_body("Tell me a very long story about dragons.", max_tokens=2000, stream=True)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            # Kept referenced: a `for` loop left by `break` would close the stream (the client would leave)
            # before the slot is looked at.
            lines = resp.iter_lines()
            next(line for line in lines if '"content":"' in line)
            [slot] = [s["id"] for s in client.get("/slots").json() if s["is_processing"]]
        # Leaving the block closed the connection mid-stream.
        # Liveness bound, not a speed check: the server notices the closed socket at its next token and
        # frees the slot.
        wait_until(
            lambda: not any(s["is_processing"] for s in client.get("/slots").json()),
            LIVENESS_S,
            "slot freed after the client left",
        )
        # Cut short, not run on within the bound: a run to its end (no context shift) fills the slot's 1024.
        assert client.get("/slots").json()[slot]["n_cached"] < 512


def test_prompt_over_the_context_is_rejected_before_any_sse_byte(server) -> None:  # type: ignore[no-untyped-def]
    long_text = "word " * 1500  # a slot has 1024 tokens
    for stream in (False, True):
        reply = httpx.post(server.base_url + "/v1/chat/completions", json=chat_body(long_text, stream=stream))
        assert reply.status_code == 400
        err = reply.json()["error"]
        assert err["type"] == "exceed_context_size_error"
        assert err["n_ctx"] == 1024 and err["n_prompt_tokens"] > 1024


def test_native_completion_and_probabilities(server) -> None:  # type: ignore[no-untyped-def]
    reply = httpx.post(
        server.base_url + "/completion",
        json={
            "prompt": "The capital of France is",
            "n_predict": 4,
            "temperature": 0,
            "n_probs": 2,
            "return_tokens": True,
        },
        timeout=60,
    ).json()
    assert reply["content"].startswith(" Paris")
    assert reply["stop"] is True and reply["stop_type"] == "limit"
    assert len(reply["tokens"]) == 4 and reply["tokens"][0] == 7042
    assert len(reply["completion_probabilities"]) == 4
    assert reply["timings"]["predicted_n"] == 4


def test_tokenize_detokenize(server) -> None:  # type: ignore[no-untyped-def]
    url = server.base_url
    tokens = httpx.post(url + "/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert tokens == [19556, 905]
    pieces = httpx.post(url + "/tokenize", json={"content": "Hello world", "with_pieces": True}).json()
    assert pieces["tokens"] == [{"id": 19556, "piece": "Hello"}, {"id": 905, "piece": " world"}]
    assert httpx.post(url + "/detokenize", json={"tokens": tokens}).json() == {"content": "Hello world"}


def test_prompt_cache_reports_cached_tokens(server) -> None:  # type: ignore[no-untyped-def]
    body = chat_body("What is the tallest mountain?", max_tokens=4, id_slot=3)
    with httpx.Client(base_url=server.base_url, timeout=60) as client:
        client.post("/v1/chat/completions", json=body)
        again = client.post("/v1/chat/completions", json=body).json()
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == again["usage"]["prompt_tokens"] - 1
    assert again["timings"]["prompt_n"] + again["timings"]["cache_n"] == again["usage"]["prompt_tokens"]


def test_props_slots_health_metrics(server) -> None:  # type: ignore[no-untyped-def]
    url = server.base_url
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    props = httpx.get(url + "/props").json()
    assert props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 1024
    slots = httpx.get(url + "/slots").json()
    assert [s["id"] for s in slots] == [0, 1, 2, 3] and all(s["n_ctx"] == 1024 for s in slots)
    metrics = httpx.get(url + "/metrics").text
    assert "# TYPE llamacpp:prompt_tokens_total counter" in metrics
    assert "llamacpp:prompt_tokens_cached_total" in metrics


# The routes that a hand-written list once missed: each must be among those generated from the URL map.
ONCE_MISSED = {
    ("POST", "/v1/chat/completions/control"),
    ("POST", "/chat/completions/control"),
    ("POST", "/v1/messages/count_tokens"),
    ("POST", "/v1/responses/input_tokens"),
    ("POST", "/v1/chat/completions/input_tokens"),
    ("POST", "/v1/responses/resp_0.js/cancel"),
    ("DELETE", "/v1/responses/resp_0.js"),
    ("POST", "/predict"),
    ("GET", "/slots/prefixes"),
    ("POST", "/reranking"),
    ("POST", "/embedding"),
    ("GET", "/tools"),
    ("POST", "/cors-proxy"),
}


def test_api_key_and_public_routes() -> None:
    """Every route of the server's URL map (with MCP's /tools and the web UI's /cors-proxy) needs the
    key but health, the model list and the web UI's files (tests/protected_routes.py); keys in either
    header; none of them in the log."""
    mcp = {"mcpServers": {"echo": {"command": sys.executable, "args": [str(ECHO_MCP)]}}}
    args = ["-m", "smollm2", "--api-key", "sekrit,other-key", "-c", "512", "--no-slots", "--ui-mcp-proxy"]
    args += ["--mcp-servers-json", json.dumps(mcp)]
    app = create_app(parse_settings(args, {})[0])  # the URL map of the server under test
    assert protected_routes.protected(app) >= ONCE_MISSED
    proc = ServerProcess(*args).wait_healthy()
    try:
        url = proc.base_url
        assert httpx.get(url + "/v1/models").status_code == 200
        assert httpx.get(url + "/").status_code == 200  # the web UI page asks for the key itself
        for key in ("sekrit", "other-key"):
            protected_routes.check(url, app, key)
        ok = httpx.post(
            url + "/v1/chat/completions", json=chat_body("Hi", max_tokens=2), headers={"X-Api-Key": "sekrit"}
        )
        assert ok.status_code == 200
        bearer = {"Authorization": "Bearer sekrit"}
        assert httpx.get(url + "/slots", headers=bearer).status_code == 501
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)
    assert proc.exited_cleanly(), proc.log()
    assert "sekrit" not in proc.log_path.read_text() and "other-key" not in proc.log_path.read_text()


def test_a_stream_is_readable_only_with_the_key_that_created_it() -> None:
    proc = ServerProcess("-m", "smollm2", "--api-key", "alice-key,bob-key", "-c", "512").wait_healthy()
    alice, bob = {"Authorization": "Bearer alice-key"}, {"Authorization": "Bearer bob-key"}
    try:
        with httpx.Client(base_url=proc.base_url, timeout=60) as client:
            body = chat_body("Count to five.", max_tokens=8, stream=True)
            created = client.post(
                "/v1/chat/completions", json=body, headers={**alice, "X-Conversation-Id": "conv-1"}
            )
            assert created.status_code == 200 and created.text.endswith("data: [DONE]\n\n")
            assert client.get("/v1/stream?conv_id=conv-1", headers=bob).status_code == 404
            lookup = {"conversation_ids": ["conv-1"]}
            assert client.post("/v1/streams/lookup", json=lookup, headers=bob).json() == []
            assert client.delete("/v1/stream?conv_id=conv-1", headers=bob).status_code == 204
            replay = client.get("/v1/stream?conv_id=conv-1", headers=alice)  # bob's DELETE did nothing
            assert replay.status_code == 200 and replay.text == created.text
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)
    assert proc.exited_cleanly(), proc.log()


def content_events(lines: Iterator[str]) -> int:
    """The content events left in a stream, read until it ends or breaks."""
    n = 0
    with contextlib.suppress(httpx.HTTPError):
        n += sum('"content":"' in line for line in lines)
    return n


def test_sigterm_during_generation_exits_promptly() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "2048").wait_healthy()
    body = chat_body("Story:", max_tokens=1500, stream=True, ignore_eos=True)
    with (
        httpx.Client(base_url=proc.base_url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        next(line for line in lines if '"content":"' in line)
        proc.stop(timeout=SIGTERM_EXIT_S)
        # Ended, not run to its 1500 tokens within the bound.
        assert content_events(lines) < 1000
    assert proc.exited_cleanly(), f"SIGTERM: no clean exit within {SIGTERM_EXIT_S} s\n{proc.log()}"


def test_a_client_that_stops_reading_is_cut_off_and_frees_its_slot() -> None:
    # 100 probabilities a token make ~7 KB events, so the kernel's socket buffers (up to 4 MB here) fill
    # within seconds; then the server's own buffer (8 KiB) overflows and the client is cut off.
    proc = ServerProcess(
        "-m", "smollm2", "-c", "4096", "-np", "2", "--stream-buffer-size", "8192"
    ).wait_healthy()
    fields = {"prompt": "Story:", "n_predict": 3000, "n_probs": 100, "stream": True, "ignore_eos": True}
    try:
        with slow_client(proc.port, "/completion", fields) as slow:  # reads nothing until it is cut off
            wait_until(lambda: "stream.slow_reader_cut" in proc.log_path.read_text(), 120, "the cut-off")
            slot_free = lambda: not httpx.get(proc.base_url + "/slots").json()[0]["is_processing"]  # noqa: E731
            wait_until(slot_free, LIVENESS_S, "the slot to be freed")
            other = httpx.post(proc.base_url + "/v1/chat/completions", json=chat_body("Hi", max_tokens=4))
            assert other.status_code == 200
            received = b""
            while chunk := slow.recv(1 << 20):
                received += chunk
        assert received.startswith(b"HTTP/1.1 200") and b"data: {" in received
        assert b'data: {"error":' in received and b"the client read too slowly" in received
        assert b'"stop":true' not in received  # no final event: the generation was cut
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


@contextlib.contextmanager
def draining(proc: ServerProcess, body: dict) -> Iterator[tuple[httpx.Client, Iterator[str]]]:
    """A chat stream that has begun, then SIGTERM; the client and the stream's lines still to read."""
    with (
        httpx.Client(base_url=proc.base_url, timeout=60) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as resp,
    ):
        lines = resp.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        proc.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: "server.draining" in proc.log_path.read_text(), LIVENESS_S, "the drain to start")
        yield client, lines


def test_sigterm_with_a_shutdown_timeout_lets_streams_finish() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--shutdown-timeout", "60").wait_healthy()
    body = chat_body("Count from one to one hundred.", max_tokens=48, stream=True, ignore_eos=True)
    with draining(proc, body) as (client, lines):
        refused = client.post("/v1/chat/completions", json=chat_body("Hi", max_tokens=2))
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
        assert refused.json()["error"]["message"] == "the server is shutting down"
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert events[-1]["choices"][0]["finish_reason"] == "length"  # all 48 tokens, not cancelled
    assert proc.proc.wait(timeout=30) == 0, proc.log()


def test_a_second_sigterm_cancels_the_drain() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "2048", "--shutdown-timeout", "600").wait_healthy()
    with draining(proc, chat_body("Story:", max_tokens=1500, stream=True, ignore_eos=True)) as (_, lines):
        assert proc.proc.poll() is None  # still draining: the generation goes on
        proc.stop(timeout=SIGTERM_EXIT_S)  # the second SIGTERM
        assert content_events(lines) < 1000  # cancelled, not run to its 1500 tokens within the bound
    assert proc.exited_cleanly(), f"second SIGTERM: no clean exit within {SIGTERM_EXIT_S} s\n{proc.log()}"


def metric(url: str, name: str) -> float:
    lines = httpx.get(url + "/metrics").text.splitlines()
    return float(next(line.split()[-1] for line in lines if line.startswith(f"llamacpp:{name} ")))


def test_a_client_leaving_the_queue_cancels_its_request() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "2048", "-np", "1", "--metrics").wait_healthy()
    url = proc.base_url
    busy = chat_body("Story:", max_tokens=300, stream=True, ignore_eos=True)
    try:
        with (
            httpx.Client(base_url=url, timeout=60) as client,
            client.stream("POST", "/v1/chat/completions", json=busy) as first,
        ):
            lines = first.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
            with client.stream("POST", "/v1/chat/completions", json=chat_body("Hi", stream=True)):
                wait_until(lambda: metric(url, "requests_deferred") == 1, LIVENESS_S, "the second to queue")
            wait_until(lambda: metric(url, "requests_deferred") == 0, LIVENESS_S, "the queued one to go")
            assert metric(url, "requests_processing") == 1  # the first still runs, alone
            events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert metric(url, "requests_processing") == 0 and metric(url, "requests_deferred") == 0
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


def test_health_is_503_while_the_model_loads() -> None:
    proc = ServerProcess("-m", "gemma3", "-c", "512")  # the port opens before the weights are packed
    try:
        first = None
        while first is None:
            with contextlib.suppress(httpx.TransportError):
                first = httpx.get(proc.base_url + "/health", timeout=5)
            assert proc.proc.poll() is None, proc.log()
        assert first.status_code == 503 and first.json()["error"]["message"] == "Loading model"
        proc.wait_healthy()
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


@pytest.mark.parametrize(
    "content, reason",
    [(b"garbage", "is not a GGUF file"), (None, "runs past the end of the file")],
    ids=["not-gguf", "truncated"],
)
def test_a_model_file_that_fails_to_load_exits_1_naming_why(
    tmp_path: Path, content: bytes | None, reason: str
) -> None:
    path = tmp_path / "broken.gguf"
    path.write_bytes(content if content is not None else resolve("smollm2").read_bytes()[: 30 << 20])
    proc = ServerProcess("-m", str(path), "-c", "512")
    assert proc.proc.wait(timeout=120) == 1
    assert "model.load_failed" in proc.log() and reason in proc.log()


def test_api_prefix_serves_every_route_under_it() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--api-prefix", "/llm/").wait_healthy(
        path="/llm/health"
    )
    try:
        url = proc.base_url
        reply = httpx.post(url + "/llm/v1/chat/completions", json=chat_body("Hi", max_tokens=2))
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None
        assert httpx.get(url + "/llm/openapi.json").json()["openapi"] == "3.1.0"
        assert httpx.get(url + "/health").status_code == 404  # only under the prefix
        assert httpx.get(url + "/llmx/health").status_code == 404
        redirect = httpx.get(url + "/llm")
        assert redirect.status_code == 308 and redirect.headers["location"] == "/llm/"
        assert httpx.get(url + "/llm/").text.startswith("<!doctype html>")
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


def test_tls_with_llama_servers_flags(tmp_path: Path) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    proc = ServerProcess(
        "-m", "smollm2", "-c", "512", "--ssl-key-file", str(key), "--ssl-cert-file", str(cert)
    )
    proc.base_url = proc.base_url.replace("http://", "https://")
    try:
        trust = ssl.create_default_context(cafile=str(cert))
        proc.wait_healthy(verify=trust)
        reply = httpx.post(
            proc.base_url + "/completion",
            json={"prompt": "Hi", "n_predict": 2, "ignore_eos": True},
            verify=trust,
        )
        assert reply.status_code == 200 and reply.json()["tokens_predicted"] == 2
        with pytest.raises(httpx.HTTPError):  # plain HTTP is not served
            httpx.get(proc.base_url.replace("https://", "http://") + "/health", timeout=5)
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


def test_tls_needs_both_files(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "--ssl-key-file", str(tmp_path)], cwd=REPO, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2 and "--ssl-key-file and --ssl-cert-file go together" in result.stderr


def test_server_wide_request_defaults() -> None:
    """--chat-template-kwargs, --reasoning-effort, --ignore-eos and -r are defaults that a request's own
    fields override."""
    template = "{{ greeting }}{{ reasoning_effort }}{% for m in messages %}{{ m.content }}{% endfor %}"
    kwargs = '{"greeting": "HELLO "}'
    args = [
        "--chat-template",
        template,
        "--chat-template-kwargs",
        kwargs,
        "--ignore-eos",
        "--reasoning-effort",
        "low",
    ]
    proc = ServerProcess("-m", "smollm2", "-c", "512", *args).wait_healthy()
    try:
        url, messages = proc.base_url, [{"role": "user", "content": "Hi"}]
        # /apply-template renders what the chat routes would: the defaults, then the request's fields.
        rendered = httpx.post(url + "/apply-template", json={"messages": messages})
        assert rendered.json()["prompt"] == "HELLO lowHi"
        own = {"messages": messages, "chat_template_kwargs": {"greeting": "BYE "}, "reasoning_effort": "high"}
        assert httpx.post(url + "/apply-template", json=own).json()["prompt"] == "BYE highHi"
        bad = httpx.post(url + "/apply-template", json={"messages": messages, "reasoning_effort": "huge"})
        assert bad.status_code == 400 and "reasoning_effort" in bad.json()["error"]["message"]
        body = {"prompt": "Hi", "n_predict": 300, "temperature": 0}
        ran_on = httpx.post(url + "/completion", json=body, timeout=120).json()
        assert ran_on["tokens_predicted"] == 300 and ran_on["stop_type"] == "limit"
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


def test_a_server_wide_grammar_constrains_requests_without_their_own() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--grammar", 'root ::= "yes" | "no"').wait_healthy()
    try:
        url, prompt = proc.base_url, {"prompt": "Is the sky blue?", "n_predict": 8, "temperature": 0}
        assert httpx.post(url + "/completion", json=prompt).json()["content"] in ("yes", "no")
        own = httpx.post(url + "/completion", json=prompt | {"grammar": 'root ::= "maybe"'}).json()
        assert own["content"] == "maybe"
    finally:
        proc.stop(timeout=SIGTERM_EXIT_S)


def test_a_bad_server_wide_grammar_fails_the_load_naming_it() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--grammar", "root ::= nope")
    assert proc.proc.wait(timeout=120) == 1
    assert "model.load_failed" in proc.log() and "--grammar:" in proc.log()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--grammar", "x", "-j", "{}"], "--grammar and -j: give one default constraint"),
        (["-j", "[1]"], "-j must be a JSON object"),
        (["--chat-template-kwargs", "nope"], "--chat-template-kwargs must be a JSON object"),
    ],
)
def test_bad_request_defaults_exit_2(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and message in result.stderr


@pytest.mark.parametrize("args", [["-c", "-5"], ["--port", "x"], ["-m", "/nonexistent/model.gguf"]])
def test_bad_cli_values_exit_non_zero_with_a_reason(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", *args], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "error" in result.stderr.lower()


def test_progress_and_timings_per_token(server) -> None:  # type: ignore[no-untyped-def]
    body = chat_body(
        "Say something.", max_tokens=4, stream=True, return_progress=True, timings_per_token=True
    )
    body["cache_prompt"] = False
    chunks = []
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    progress = [c["prompt_progress"] for c in chunks if "prompt_progress" in c]
    assert progress and progress[-1]["processed"] == progress[-1]["total"] > 0
    # llama-server's 0% update first (nothing run: processed == cache), then one per prompt chunk; each
    # with the timings so far under timings_per_token, the prompt's time never going back.
    assert len(progress) >= 2 and progress[0]["processed"] == progress[0]["cache"] == 0
    timings = [c["timings"] for c in chunks if "prompt_progress" in c]
    assert timings[0]["prompt_n"] == 0 and timings[0]["prompt_ms"] == 0.0 and timings[0]["predicted_n"] == 0
    assert timings[-1]["prompt_n"] == progress[-1]["processed"] and timings[-1]["prompt_ms"] > 0
    assert all(a["prompt_ms"] <= b["prompt_ms"] for a, b in zip(timings, timings[1:], strict=False))
    first_content = next(
        i for i, c in enumerate(chunks) if c["choices"] and c["choices"][0]["delta"].get("content")
    )
    assert all("prompt_progress" not in c for c in chunks[first_content:])
    assert all("timings" in c for c in chunks[first_content:] if c["choices"])
    assert chunks[first_content]["timings"]["predicted_n"] == 1


def test_timings_ride_on_the_usage_chunk(server) -> None:  # type: ignore[no-untyped-def]
    """With include_usage the last chunk (usage, no choices) carries the timings, as llama-server's."""
    body = chat_body("Say something.", max_tokens=4, stream=True, stream_options={"include_usage": True})
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60) as resp:
        chunks = [json.loads(ln[6:]) for ln in resp.iter_lines() if ln.startswith("data: {")]
    last = chunks[-1]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == last["timings"]["predicted_n"]
    assert all("timings" not in c for c in chunks[:-1])


def test_metrics_start_time_header_and_rates_over_decode_steps(server) -> None:  # type: ignore[no-untyped-def]
    """/metrics says when the server started (llama-server's Process-Start-Time-Unix); a generation's
    rate leaves out its first token, which the prompt's last batch gave (1 token: no rate)."""
    reply = httpx.get(server.base_url + "/metrics")
    started = int(reply.headers["Process-Start-Time-Unix"])
    assert started <= time.time() and started > time.time() - 24 * 3600
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        one = client.post("/completion", json={"prompt": "I believe", "n_predict": 1}).json()["timings"]
        assert one["predicted_n"] == 1 and one["predicted_per_second"] == 0.0
        body = {"prompt": "I believe", "n_predict": 16, "ignore_eos": True}
        many = client.post("/completion", json=body).json()["timings"]
    assert many["predicted_n"] == 16
    assert many["predicted_per_second"] == pytest.approx(1e3 / many["predicted_ms"] * 15)
