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
    """Adapter 0 at scale 1 (--lora), adapter 1 at 0.5 (--lora-scaled); 3 slots."""
    proc = ServerProcess(
        "-m", "smollm2", "-np", "3", "-c", "1536", "--lora", str(adapters[0]),
        "--lora-scaled", f"{adapters[1]}:0.5",
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
