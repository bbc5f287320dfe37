"""The cluster's fleet changing shape, on a real local Ray cluster (slow: Ray and replicas start):
autoscaling between --replicas-min 1 and --replicas-max 2 under a real queue and when idle, and several
models of a preset file served side by side, each with its own replicas, routed by `model`."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import require
from tests.server_process import ServerProcess, wait_until
from tests.test_cluster_server import REPLICA, START_S, chat, metrics

pytestmark = pytest.mark.slow
require(None if importlib.util.find_spec("ray") else "Ray is not installed (pip install -e '.[cluster]')")


def listing(proc: ServerProcess) -> dict[str, dict[str, Any]]:
    models = httpx.get(proc.base_url + "/models", timeout=10).json()["data"]
    return {m["id"]: m for m in models}


def statuses(proc: ServerProcess, model: str = "smollm2") -> list[str]:
    return [r["status"] for r in listing(proc)[model]["replicas"]]


def test_autoscaling_grows_under_a_queue_and_shrinks_when_idle() -> None:
    proc = ServerProcess(
        "--cluster", "ray:local", "-m", "smollm2", "-t", "1", "-c", "4096", "-np", "2", "--metrics",
        "--replicas-min", "1", "--replicas-max", "2", "--scale-up-after", "2", "--scale-down-after", "5",
    )  # fmt: skip
    try:
        proc.wait_healthy(START_S)
        wait_until(lambda: statuses(proc) == ["ready"], START_S, "one replica ready")
        scaling = listing(proc)["smollm2"]["scaling"]
        assert (scaling["min"], scaling["max"], scaling["current"]) == (1, 2, 1)
        with httpx.Client(base_url=proc.base_url, timeout=600) as client:
            # 8 long requests on 2 slots: a queue of 6 on the one replica.
            long = chat("Write a long story about a lighthouse keeper.", 200, ignore_eos=True)
            with ThreadPoolExecutor(8) as pool:
                first = [pool.submit(client.post, "/v1/chat/completions", json=long) for _ in range(8)]
                wait_until(lambda: len(statuses(proc)) == 2, 120, "a second replica added")
                wait_until(lambda: statuses(proc) == ["ready", "ready"], START_S, "the second replica ready")
                # New requests go to the new, idle replica.
                more = list(
                    pool.map(lambda i: client.post("/v1/chat/completions", json=chat(f"Hi {i}")), range(4))
                )
                assert [r.status_code for r in more] == [200] * 4
                assert "1" in {r.headers[REPLICA] for r in more}
                assert [f.result().status_code for f in first] == [200] * 8  # no request failed
            # Idle: one replica is drained and stopped.
            wait_until(lambda: len(statuses(proc)) == 1, 180, "back to one replica")
            assert statuses(proc) == ["ready"]
            assert client.post("/v1/chat/completions", json=chat("Still there?")).status_code == 200
            samples = metrics(client)
        assert samples['llamba:cluster_scale_decisions_total{action="up",model="smollm2"}'] == 1
        assert samples['llamba:cluster_scale_decisions_total{action="down",model="smollm2"}'] == 1
        assert samples['llamba:cluster_replicas_current{model="smollm2"}'] == 1
        log = proc.log_path.read_text()
        decisions = [line for line in log.splitlines() if "cluster.scale" in line and "action=" in line]
        assert any("action=up" in d and "queue" in d for d in decisions), decisions
        assert any("action=down" in d and "utilisation" in d for d in decisions), decisions
    finally:
        proc.stop(timeout=30)


def test_several_models_each_with_its_replicas_routed_by_model(tmp_path: Path) -> None:
    preset = tmp_path / "cluster.ini"
    # Their own `replicas` lines override --replicas 2 (one CPU each: the local Ray has this VM's 2).
    preset.write_text("[smollm2]\nreplicas = 1\n\n[gemma3]\nreplicas = 1\nc = 2048\n")
    proc = ServerProcess(
        "--cluster", "ray:local", "--models-preset", str(preset), "--replicas", "2", "-t", "1", "-np", "2",
        "--metrics",
    )  # fmt: skip
    try:
        proc.wait_healthy(START_S)
        models = listing(proc)
        assert set(models) == {"smollm2", "gemma3"}  # qwen2.5-coder has no replicas line: not served
        assert all(len(m["replicas"]) == 1 and m["replicas"][0]["status"] == "ready" for m in models.values())
        with httpx.Client(base_url=proc.base_url, timeout=300) as client:
            for name in ("smollm2", "gemma3"):
                reply = client.post("/v1/chat/completions", json={**chat("Hi"), "model": name})
                assert reply.status_code == 200, reply.text
                assert reply.json()["model"] == name
            default = client.post("/v1/chat/completions", json=chat("Hi"))
            assert default.status_code == 200 and default.json()["model"] == "smollm2"
            unknown = client.post("/v1/chat/completions", json={**chat("Hi"), "model": "qwen2.5-coder"})
            assert unknown.status_code == 400
            assert "not found" in unknown.json()["error"]["message"]
            props = client.get("/props", params={"model": "gemma3"}).json()
            assert props["model_alias"] == "gemma3"
            samples = metrics(client)
        for name in ("smollm2", "gemma3"):
            assert samples[f'llamacpp:tokens_predicted_total{{model="{name}",replica="0"}}'] > 0
            assert samples[f'llamba:cluster_replicas_up{{model="{name}"}}'] == 1
    finally:
        proc.stop(timeout=30)
