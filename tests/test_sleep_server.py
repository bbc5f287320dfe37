"""--sleep-idle-seconds on a single-model server: the idle model frees its memory, reports it on /props,
and the next request wakes it and answers as before. Real server, real model."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from tests.server_process import ServerProcess, wait_until

CHAT = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 12, "temperature": 0}


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def is_sleeping(base_url: str, **params: str) -> bool:
    r = httpx.get(base_url + "/props", params=params, timeout=10)
    assert r.status_code == 200, r.text
    return bool(r.json()["is_sleeping"])


def rss_while_busy(base_url: str, pid: int, body: dict) -> int:
    """The process's RSS while a streamed completion runs (the model is surely awake and in use)."""
    seen: list[int] = []
    done = threading.Event()

    def measure() -> None:
        wait_until(lambda: done.is_set() or bool(seen.append(rss_bytes(pid)) or len(seen) > 3), 60, "rss")

    with httpx.stream("POST", base_url + "/completion", json=body | {"stream": True}, timeout=120) as r:
        lines = r.iter_lines()
        next(line for line in lines if line.startswith("data: "))
        measure()
        done.set()
    return max(seen)


def test_idle_server_sleeps_frees_its_weights_and_wakes() -> None:
    proc = ServerProcess("-m", "smollm2", "-c", "1024", "--sleep-idle-seconds", "1").wait_healthy()
    try:
        url = proc.base_url
        before = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=120).json()
        body = {"prompt": "Once upon a time", "n_predict": 64, "ignore_eos": True}
        awake_rss = rss_while_busy(url, proc.proc.pid, body)
        wait_until(lambda: is_sleeping(url), 30, "asleep")
        weights = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["meta"]["size"]
        # the memory goes back while it falls asleep (the engine thread ends, the heap is trimmed)
        wait_until(lambda: awake_rss - rss_bytes(proc.proc.pid) >= weights, 30, "RSS down by the weights")
        # reading the server's state neither fails nor wakes it
        assert httpx.get(url + "/health").status_code == 200
        assert httpx.get(url + "/slots").status_code == 200
        assert is_sleeping(url)
        after = httpx.post(url + "/v1/chat/completions", json=CHAT, timeout=120)
        assert after.status_code == 200
        assert after.json()["choices"][0]["message"] == before["choices"][0]["message"]
        assert not is_sleeping(url)
        assert json.loads(httpx.get(url + "/props").text)["total_slots"] == 1
    finally:
        proc.stop()
    assert proc.exited_cleanly()
