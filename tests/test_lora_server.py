"""LoRA adapters through a real server (--lora, --lora-scaled, /lora-adapters, a request's `lora`): SmolLM2
with two SYNTHETIC adapters (tests/synthetic_lora.py) written for it."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from engine.model_files import resolve
from tests.server_process import ServerProcess, wait_until
from tests.synthetic_lora import write_lora

PROMPT = "The capital of France is a city where"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("lora")
    base = resolve("smollm2")
    return [
        write_lora(base, folder / "a.gguf", seed=0),
        write_lora(base, folder / "b.gguf", seed=1, dtype="F16", rank=4),
    ]


@pytest.fixture(scope="module")
def lora_server(adapters: list[Path]) -> Iterator[ServerProcess]:
    """Adapter 0 at scale 1 (--lora), adapter 1 at 0.5 (--lora-scaled); 3 slots; slot files beside them."""
    proc = ServerProcess(
        "-m", "smollm2", "-np", "3", "-c", "1536", "--lora", str(adapters[0]),
        "--lora-scaled", f"{adapters[1]}:0.5", "--slot-save-path", str(adapters[0].parent),
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


def complete(server: ServerProcess, **fields: object) -> httpx.Response:
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "cache_prompt": False} | fields
    return httpx.post(server.base_url + "/completion", json=body, timeout=120)


def text(server: ServerProcess, **fields: object) -> str:
    r = complete(server, **fields)
    assert r.status_code == 200, r.text
    return str(r.json()["content"])


def test_lora_adapters_round_trip(lora_server: ServerProcess, adapters: list[Path]) -> None:
    url = lora_server.base_url + "/lora-adapters"
    listed = httpx.get(url).json()
    assert listed == [
        {"id": 0, "path": str(adapters[0]), "scale": 1.0, "task_name": "", "prompt_prefix": ""},
        {"id": 1, "path": str(adapters[1]), "scale": 0.5, "task_name": "", "prompt_prefix": ""},
    ]
    try:
        r = httpx.post(url, json=[{"id": 1, "scale": 0.25}])
        assert r.status_code == 200 and r.json() == {"success": True}
        assert [a["scale"] for a in httpx.get(url).json()] == [0.0, 0.25]  # unlisted: 0, as llama-server
    finally:
        httpx.post(url, json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_global_scales_apply_to_requests_without_lora(lora_server: ServerProcess) -> None:
    url = lora_server.base_url + "/lora-adapters"
    explicit = text(lora_server, lora=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])
    assert text(lora_server) == explicit
    try:
        httpx.post(url, json=[])
        assert text(lora_server) == text(lora_server, lora=[])  # [] = every adapter at 0 (the base)
    finally:
        httpx.post(url, json=[{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}])


def test_request_scale_changes_the_answer(lora_server: ServerProcess) -> None:
    base = text(lora_server, lora=[{"id": 0, "scale": 0.0}])
    full = text(lora_server, lora=[{"id": 0, "scale": 1.0}])
    assert base != full
    assert text(lora_server, lora=[{"id": 0, "scale": 1.0}]) == full  # deterministic


def test_chat_and_v1_completions_take_lora(lora_server: ServerProcess) -> None:
    def chat(lora: list[dict]) -> str:
        body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 10}
        r = httpx.post(
            lora_server.base_url + "/v1/chat/completions", json=body | {"temperature": 0, "lora": lora}
        )
        assert r.status_code == 200, r.text
        return str(r.json()["choices"][0]["message"]["content"])

    assert chat([{"id": 0, "scale": 0.0}]) != chat([{"id": 0, "scale": 2.0}])
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "lora": [{"id": 7, "scale": 1}]}
    r = httpx.post(lora_server.base_url + "/v1/completions", json=body)
    assert r.status_code == 400 and "unknown LoRA adapter id 7" in r.text


def test_three_adapter_sets_batched_answer_as_alone(lora_server: ServerProcess) -> None:
    """Adapter 0, adapter 1 and the base in three concurrent requests: each the answer it gives alone."""
    sets = [[{"id": 0, "scale": 1.0}], [{"id": 1, "scale": 1.0}], []]
    alone = [text(lora_server, lora=s, n_predict=24) for s in sets]
    assert len(set(alone)) == 3
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda s: text(lora_server, lora=s, n_predict=24), sets))
    assert together == alone


def test_cached_prefix_is_not_reused_under_another_adapter_set(lora_server: ServerProcess) -> None:
    """The same prompt with prompt caching: a slot's cells from the base are not a prefix under adapter 0."""
    prompt = "A prompt of its own, so that no earlier request cached it: once upon a time"
    first = complete(lora_server, prompt=prompt, lora=[], cache_prompt=True, id_slot=0).json()
    adapted = {"prompt": prompt, "lora": [{"id": 0, "scale": 1.0}], "cache_prompt": True, "id_slot": 0}
    second = complete(lora_server, **adapted).json()
    assert second["timings"]["cache_n"] == 0
    again = complete(lora_server, **adapted).json()
    assert again["timings"]["cache_n"] > 0 and again["content"] == second["content"]
    assert first["content"] != second["content"]


def test_a_restored_slot_keeps_the_adapter_set_its_cells_came_from(lora_server: ServerProcess) -> None:
    """A slot saved after a request under adapter 0 and restored: a base request reuses none of its cells
    (they are adapter 0's), the same adapter request reuses them and answers as before."""

    def slot(action: str) -> None:
        r = httpx.post(lora_server.base_url + f"/slots/0?action={action}", json={"filename": "adapted.bin"})
        assert r.status_code == 200, r.text

    prompt = "A slot saved under an adapter, then restored: its cells were computed"
    adapted = {"prompt": prompt, "lora": [{"id": 0, "scale": 1.0}], "cache_prompt": True, "id_slot": 0}
    first = complete(lora_server, **adapted).json()
    slot("save")
    slot("restore")
    base = complete(lora_server, prompt=prompt, lora=[], cache_prompt=True, id_slot=0).json()
    assert base["timings"]["cache_n"] == 0
    slot("restore")
    again = complete(lora_server, **adapted).json()
    assert again["timings"]["cache_n"] > 0 and again["content"] == first["content"]


@pytest.mark.parametrize(
    ("lora", "says"),
    [
        ([{"id": 5, "scale": 1.0}], "unknown LoRA adapter id 5"),
        ([{"id": 0, "scale": "high"}], "the scale of adapter 0 is not a number"),
        ({"id": 0, "scale": 1.0}, "'lora' must be an array"),
        ([{"id": "0", "scale": 1.0}], "'id' must be an integer"),
    ],
)
def test_bad_lora_is_a_400_naming_it(lora_server: ServerProcess, lora: object, says: str) -> None:
    r = complete(lora_server, lora=lora)
    assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    r = httpx.post(lora_server.base_url + "/lora-adapters", json=lora if isinstance(lora, list) else lora)
    assert r.status_code == 400


def test_adapter_for_another_model_fails_the_start(tmp_path: Path) -> None:
    wrong = write_lora(resolve("gemma3"), tmp_path / "gemma.gguf", layers=range(1))
    proc = ServerProcess("-m", "smollm2", "--lora", str(wrong))
    why = "is for architecture 'gemma3', the model is 'llama'"
    try:
        wait_until(lambda: why in proc.log(), 120, "the load failure")

        def health_says_it() -> bool:  # or the process ended: either way nothing serves the bad adapter
            if proc.proc.poll() is not None:
                return True
            try:
                health = httpx.get(proc.base_url + "/health", timeout=5)
            except httpx.HTTPError:
                return False
            return health.status_code == 500 and why in health.json()["error"]["message"]

        wait_until(health_says_it, 30, "/health naming the failure")
    finally:
        proc.stop()


# -- adapters served as models (vLLM's names: --lora NAME=FILE, --lora-modules, /v1/load_lora_adapter) --
KEY = "lora-admin-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def third(adapters: list[Path]) -> Path:
    """A third adapter, loaded at runtime."""
    return write_lora(resolve("smollm2"), adapters[0].parent / "c.gguf", seed=2, rank=4)


@pytest.fixture(scope="module")
def named_server(adapters: list[Path]) -> Iterator[ServerProcess]:
    """Adapter 0 as model `sql` (--lora NAME=FILE), adapter 1 as `style` (vLLM's --lora-modules); 3 slots,
    behind an API key."""
    proc = ServerProcess(
        "-m", "smollm2", "-a", "base", "-np", "3", "-c", "1536", "--api-key", KEY,
        "--lora", f"sql={adapters[0]}", "--lora-modules", f"style={adapters[1]}",
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


def _post(server: ServerProcess, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=AUTH, timeout=120)


def _chat(server: ServerProcess, n: int = 16, **fields: object) -> str:
    body = {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": n, "temperature": 0}
    r = _post(server, "/v1/chat/completions", body | fields)
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _ids(server: ServerProcess) -> dict[str, int]:
    listed = httpx.get(server.base_url + "/lora-adapters", headers=AUTH).json()
    return {a["name"]: a["id"] for a in listed if "name" in a}


def _busy(server: ServerProcess) -> int:
    slots = httpx.get(server.base_url + "/slots", headers=AUTH).json()
    return sum(bool(slot["is_processing"]) for slot in slots)


def _models(server: ServerProcess) -> dict[str, dict]:
    return {m["id"]: m for m in httpx.get(server.base_url + "/v1/models").json()["data"]}


def test_named_adapters_are_listed_as_models(named_server: ServerProcess, adapters: list[Path]) -> None:
    models = _models(named_server)
    assert models["sql"]["parent"] == "base" and models["sql"]["root"] == str(adapters[0])
    assert models["style"]["parent"] == "base" and models["style"]["root"] == str(adapters[1])
    assert "parent" not in models["base"]
    # their global scale is 0: the base model's requests do not run under them
    assert _ids(named_server) == {"sql": 0, "style": 1}
    assert _chat(named_server) == _chat(named_server, lora=[])


def test_an_adapter_model_through_the_openai_sdk_is_the_adapter_at_scale_1(
    named_server: ServerProcess,
) -> None:
    import openai

    client = openai.OpenAI(base_url=named_server.base_url + "/v1", api_key=KEY)
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = client.chat.completions.create(model="sql", messages=messages, max_tokens=16, temperature=0)  # type: ignore[arg-type]
    ids = _ids(named_server)
    assert reply.choices[0].message.content == _chat(named_server, lora=[{"id": ids["sql"], "scale": 1}])
    assert reply.choices[0].message.content != _chat(named_server, model="base")
    other = client.completions.create(model="style", prompt=PROMPT, max_tokens=12, temperature=0)
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0, "lora": [{"id": ids["style"], "scale": 1}]}
    assert other.choices[0].text == _post(named_server, "/completion", body).json()["content"]
    with pytest.raises(openai.NotFoundError, match="model 'nope' not found"):
        client.chat.completions.create(model="nope", messages=messages, max_tokens=4)  # type: ignore[arg-type]


def test_every_generation_route_takes_the_adapter_name(named_server: ServerProcess) -> None:
    sql = _chat(named_server, model="sql")
    base = _chat(named_server, model="base")
    assert sql != base
    message = {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "max_tokens": 16,
        "temperature": 0,
    }
    r = _post(named_server, "/v1/messages", message | {"model": "sql"})
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == sql
    ollama = message | {"stream": False, "options": {"temperature": 0, "num_predict": 16}}
    for name, want in (("sql:latest", sql), ("base", base)):
        r = _post(named_server, "/api/chat", ollama | {"model": name})
        assert r.status_code == 200, r.text
        assert r.json()["message"]["content"] == want
    done = _post(named_server, "/completion", {"prompt": PROMPT, "n_predict": 8, "model": "sql", "lora": []})
    assert done.status_code == 400 and "'lora' cannot be given" in done.text


@pytest.mark.parametrize(
    ("path", "body", "shape"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "openai"),
        ("/completion", {"prompt": "hi"}, "openai"),
        ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}, "anthropic"),
        ("/api/chat", {"messages": [{"role": "user", "content": "hi"}]}, "ollama"),
    ],
)
def test_an_unknown_model_name_is_the_routes_404(
    named_server: ServerProcess, path: str, body: dict, shape: str
) -> None:
    r = _post(named_server, path, body | {"model": "nope"})
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    message = {
        "openai": lambda: error["message"],
        "anthropic": lambda: error["message"],
        "ollama": lambda: error,
    }
    assert message[shape]() == "model 'nope' not found"
    if shape == "anthropic":
        assert r.json()["type"] == "error" and error["type"] == "not_found_error"


def test_load_and_unload_at_runtime(named_server: ServerProcess, third: Path) -> None:
    url = named_server.base_url
    assert (
        httpx.post(
            url + "/v1/load_lora_adapter", json={"lora_name": "late", "lora_path": str(third)}
        ).status_code
        == 401
    )
    r = _post(named_server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(third)})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' added successfully."
    try:
        assert _models(named_server)["late"]["parent"] == "base"
        late_id = _ids(named_server)["late"]
        assert late_id == 2
        late = _chat(named_server, model="late")
        assert late == _chat(named_server, lora=[{"id": late_id, "scale": 1}])
        assert late not in (_chat(named_server, model="base"), _chat(named_server, model="sql"))
        again = _post(named_server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(third)})
        assert again.status_code == 400 and "has already been loaded" in again.text
    finally:
        r = _post(named_server, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'late' removed successfully."
    assert "late" not in _models(named_server)
    gone = _post(
        named_server,
        "/v1/chat/completions",
        {"model": "late", "messages": [{"role": "user", "content": "hi"}]},
    )
    assert gone.status_code == 404 and "model 'late' not found" in gone.text
    assert (
        _post(named_server, "/completion", {"prompt": "x", "lora": [{"id": 2, "scale": 1}]}).status_code
        == 400
    )
    r = _post(named_server, "/v1/unload_lora_adapter", {"lora_name": "late"})
    assert r.status_code == 404 and "The lora adapter 'late' cannot be found." in r.text


def test_a_bad_file_or_another_base_is_a_400_naming_it(named_server: ServerProcess, tmp_path: Path) -> None:
    missing = tmp_path / "missing.gguf"
    r = _post(named_server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(missing)})
    assert r.status_code == 400 and str(missing) in r.json()["error"]["message"]
    wrong = write_lora(resolve("gemma3"), tmp_path / "gemma.gguf", layers=range(1))
    r = _post(named_server, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(wrong)})
    assert r.status_code == 400 and "is for architecture 'gemma3', the model is 'llama'" in r.text
    assert _post(named_server, "/v1/load_lora_adapter", {"lora_name": "x"}).status_code == 400
    assert "x" not in _models(named_server)


def test_two_adapter_models_and_the_base_batched_answer_as_alone(named_server: ServerProcess) -> None:
    names = ["sql", "style", "base"]
    alone = [_chat(named_server, n=24, model=m) for m in names]
    assert len(set(alone)) == 3
    with ThreadPoolExecutor(3) as pool:
        together = list(pool.map(lambda m: _chat(named_server, n=24, model=m), names))
    assert together == alone


def test_loading_and_unloading_while_requests_run_changes_no_answer(
    named_server: ServerProcess, third: Path
) -> None:
    """A long request under `sql` and one under `late`: `late` unloaded while they run, another adapter
    loaded meanwhile; both answers are what they are alone."""
    _post(named_server, "/v1/load_lora_adapter", {"lora_name": "late", "lora_path": str(third)})
    alone = {m: _chat(named_server, n=48, model=m) for m in ("sql", "late")}
    with ThreadPoolExecutor(2) as pool:
        running = {m: pool.submit(_chat, named_server, 48, model=m) for m in alone}
        wait_until(lambda: _busy(named_server) >= 2, 30, "both requests running")
        r = _post(named_server, "/v1/unload_lora_adapter", {"lora_name": "late"})
        assert r.status_code == 200
        r = _post(named_server, "/v1/load_lora_adapter", {"lora_name": "later", "lora_path": str(third)})
        assert r.status_code == 200
        assert {m: f.result() for m, f in running.items()} == alone
    assert _post(named_server, "/v1/unload_lora_adapter", {"lora_name": "later"}).status_code == 200


# ---------------------------------------------------------------------------------------------------
# An adapter named by its file (llama.cpp's adapter.lora.task_name) and an activated LoRA (aLoRA).

INVOKE = " Answer:"


@pytest.fixture(scope="module")
def invocation() -> tuple[int, ...]:
    from engine.gguf import GGUFFile
    from engine.text.tokenizer import Tokenizer

    return tuple(Tokenizer.from_gguf(GGUFFile(resolve("smollm2"))).encode(INVOKE, add_special=False))


@pytest.fixture(scope="module")
def file_named_server(
    tmp_path_factory: pytest.TempPathFactory, invocation: tuple[int, ...]
) -> Iterator[ServerProcess]:
    """Adapter 0 carries the task name `sql-helper`, adapter 1 is an aLoRA invoked by INVOKE; both at
    scale 0 (--lora-init-without-apply); 2 slots, --cache-ram on."""
    folder, base = tmp_path_factory.mktemp("lora-meta"), resolve("smollm2")
    named = write_lora(base, folder / "named.gguf", seed=4, task_name="sql-helper")
    alora = write_lora(base, folder / "alora.gguf", seed=5, strength=0.3, invocation_tokens=invocation)
    proc = ServerProcess(
        "-m", "smollm2", "-np", "2", "-c", "1024", "--lora-init-without-apply",
        "--lora", str(named), "--lora", str(alora),
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


def test_an_adapter_named_by_its_file_is_a_model(
    file_named_server: ServerProcess, invocation: tuple[int, ...]
) -> None:
    """/lora-adapters shows the file's task name (and the aLoRA's invocation, llama-server's fields); the
    task name is a model of /v1/models that runs the adapter at scale 1; other model names still run the
    base, as without named adapters."""
    server = file_named_server
    listed = httpx.get(server.base_url + "/lora-adapters").json()
    assert listed[0]["task_name"] == "sql-helper" and listed[0]["name"] == "sql-helper"
    assert listed[1]["alora_invocation_tokens"] == list(invocation)
    assert listed[1]["alora_invocation_string"] == INVOKE
    assert listed[1]["task_name"] == "" and "name" not in listed[1]
    assert _models(server)["sql-helper"]["parent"]
    adapted = text(server, model="sql-helper")
    assert adapted == text(server, lora=[{"id": 0, "scale": 1}])
    assert adapted != text(server, model="some-client-default")


def test_an_alora_applies_from_its_invocation(
    file_named_server: ServerProcess, invocation: tuple[int, ...]
) -> None:
    """Without the invocation in the prompt an aLoRA request is the base's; with it, it is not, and the
    base request's cells before the activation (one token before the invocation, llama-server's) are
    reused from the slot; the same aLoRA request again reuses its whole prompt."""
    server, alora = file_named_server, [{"id": 1, "scale": 1.0}]
    assert text(server, lora=alora) == text(server)
    prompt = PROMPT + INVOKE
    base = complete(server, prompt=prompt, cache_prompt=True, id_slot=0).json()
    adapted = complete(server, prompt=prompt, cache_prompt=True, id_slot=0, lora=alora).json()
    assert adapted["content"] != base["content"]
    n_prompt = base["timings"]["prompt_n"] + base["timings"]["cache_n"]
    assert adapted["timings"]["cache_n"] == n_prompt - len(invocation) - 1
    again = complete(server, prompt=prompt, cache_prompt=True, id_slot=0, lora=alora).json()
    assert again["content"] == adapted["content"]
    assert again["timings"]["cache_n"] == n_prompt - 1
