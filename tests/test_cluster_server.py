"""Scale-out on a real local Ray cluster: `llamba-server --cluster ray:local` with SmolLM2 replicas of one
thread each, talked to over HTTP as clients do.

In `make test` (~15 s: Ray's head and one replica start): one replica answering a chat through the
cluster router, and a resumable stream resumed and stopped through it; every route of the router needing
its API key; the replica listening on loopback only and refusing any key but the replicas' secret.
Slow (two replicas): concurrent chats spread over both replicas; a shared long system prompt placed on
the replica that cached it (`timings.cache_n`); the cluster's /metrics (its own counters and each
replica's llamacpp:* labelled by replica); killing one replica's server process: the other's in-flight
stream finishes, its conversation answers 404, new requests go to the survivor without a 5xx, and Ray
replaces the dead replica.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from server.cluster.app import create_cluster_app
from server.cluster.monitor import ReplicaHandle
from server.config.parse import parse_settings
from tests import protected_routes
from tests.conftest import require
from tests.server_process import ServerProcess, wait_until

require(None if importlib.util.find_spec("ray") else "Ray is not installed (pip install -e '.[cluster]')")

CONV = "X-Conversation-Id"
REPLICA = "X-Llamba-Replica"
KEY = "cluster-key"
REPLICA_SECRET = "replica-secret"
SECRET_ENV = "LLAMBA_CLUSTER_SECRET"
ONE_REPLICA = ("--cluster", "ray:local", "--replicas", "1", "-m", "smollm2", "-t", "1", "--api-key", KEY)
START_S = 600  # Ray's start and two replicas' loads (and JIT compiles on a first run) on 2 busy cores
# ~600 tokens: 9 whole 64-token blocks of the prompt-cache summary.
SYSTEM = "You are a careful assistant for a library. " + " ".join(
    f"Rule {i}: books numbered {i * 7} to {i * 7 + 6} live on shelf {i % 9} of aisle {i % 4}."
    for i in range(40)
)


def replicas(proc: ServerProcess) -> list[dict[str, Any]]:
    [model] = httpx.get(proc.base_url + "/models", timeout=10).json()["data"]
    return model["replicas"]


def all_ready(proc: ServerProcess) -> bool:
    return all(r["status"] == "ready" for r in replicas(proc))


@pytest.fixture(scope="module")
def cluster():  # type: ignore[no-untyped-def]
    proc = ServerProcess(
        "--cluster", "ray:local", "--replicas", "2", "-m", "smollm2", "-t", "1", "-c", "8192", "-np", "4",
        "--metrics",
    )  # fmt: skip
    try:
        proc.wait_healthy(START_S)
        wait_until(lambda: all_ready(proc), START_S, "both replicas ready")
        yield proc
    finally:
        proc.stop(timeout=30)


@pytest.fixture
def client(cluster: ServerProcess):  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=cluster.base_url, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def one_replica():  # type: ignore[no-untyped-def]
    """The cheapest real cluster: a local Ray head, one SmolLM2 replica (its own server process, a Ray
    actor's child) and the cluster router in front of it; with an API key, and the replicas' secret set
    (LLAMBA_CLUSTER_SECRET) so that a test can reach the replica directly."""
    proc = ServerProcess(*ONE_REPLICA, env={SECRET_ENV: REPLICA_SECRET})
    try:
        proc.wait_healthy(START_S)
        wait_until(lambda: all_ready(proc), START_S, "the replica ready")
        yield proc
    finally:
        proc.stop(timeout=30)


def say_hi(client: httpx.Client, i: int) -> httpx.Response:
    return client.post("/v1/chat/completions", json=chat(f"Hi {i}"))


def lookup(client: httpx.Client, conv: str) -> list[bool]:
    reply = client.post("/v1/streams/lookup", json={"conversation_ids": [conv]})
    return [info["is_done"] for info in reply.json()]


def chat(question: str, max_tokens: int = 8, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages = ([{"role": "system", "content": system}] if system else []) + [
        {"role": "user", "content": question}
    ]
    return {"messages": messages, "max_tokens": max_tokens, "temperature": 0, **extra}


def test_one_replica_answers_a_chat_and_resumes_and_stops_a_stream(one_replica: ServerProcess) -> None:
    """Through the router: a chat; a stream the client leaves after its first token, generated on to
    its end and replayed (whole, and from an offset) with the text of the same greedy request answered
    whole; a stream stopped by DELETE /v1/stream, which ends the original response too."""
    client = httpx.Client(base_url=one_replica.base_url, timeout=300, headers=bearer(KEY))
    with client:
        hi = client.post("/v1/chat/completions", json=chat("Hi"))
        assert hi.status_code == 200 and hi.headers[REPLICA] == "0", hi.text
        assert hi.json()["choices"][0]["message"]["content"].strip()
        resume_and_stop(client)


def test_every_route_of_the_cluster_needs_the_key(one_replica: ServerProcess) -> None:
    """The cluster router's URL map (its front door), asked over HTTP (tests/protected_routes.py)."""
    from server.cluster.main import scaling, served_models  # imports Ray (checked above)

    settings = parse_settings(list(ONE_REPLICA), {})[0]
    entry = served_models(settings)[0]
    policy, initial = scaling(settings, entry)
    # Only its URL map is used: nothing is started (its replicas start when it serves).
    app = create_cluster_app(settings, [(entry, never_started, policy, initial)], "unused", "unused")
    assert {("POST", "/"), ("POST", "/v1/completions"), ("GET", "/props")} <= protected_routes.protected(app)
    # `model=` of a model that is not there: each route runs, and nothing is generated.
    protected_routes.check(one_replica.base_url, app, KEY, {"model": "no-such-model"})


def never_started() -> ReplicaHandle:
    raise AssertionError("the URL map's app starts no replica")


def test_a_local_replica_listens_on_loopback_only_and_wants_the_secret(one_replica: ServerProcess) -> None:
    """`ray:local`: the replica's server is bound to 127.0.0.1 (its URL, and the kernel's listening
    sockets on its port), not to the node's network address; straight to it, a request without the
    replicas' secret is refused, the cluster's own API key and near misses of the secret included."""
    [replica] = replicas(one_replica)
    url = httpx.URL(replica["url"])
    assert url.host == replica["node_ip"] == "127.0.0.1", replica
    assert url.port is not None and listening_addresses(url.port) == {"127.0.0.1"}
    [model] = httpx.get(one_replica.base_url + "/models", timeout=10).json()["data"]
    node_ip = model["cluster"]["address"].rsplit(":", 1)[0]  # Ray's GCS: the node's network address
    if node_ip != "127.0.0.1":  # a machine with a network: the replica is not on it
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://{node_ip}:{url.port}/health", timeout=10)
    chat_url = replica["url"] + "/v1/chat/completions"
    wrong = [{}, bearer(KEY), bearer(REPLICA_SECRET + "x"), {"X-Api-Key": REPLICA_SECRET[:-1]}]
    for headers in wrong:
        reply = httpx.post(chat_url, json=chat("Hi"), headers=headers, timeout=30)
        assert reply.status_code == 401, (headers, reply.text)
    reply = httpx.post(chat_url, json=chat("Hi"), headers=bearer(REPLICA_SECRET), timeout=300)
    assert reply.status_code == 200, reply.text


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port` (Linux's /proc/net/tcp and tcp6)."""
    found: set[str] = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        path = Path("/proc/net") / table
        for line in path.read_text().splitlines()[1:] if path.exists() else []:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                words = [bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, len(address), 8)]
                found.add(socket.inet_ntop(family, b"".join(words)))
    return found


@pytest.mark.slow
def test_a_resumable_stream_resumes_and_stops_through_the_cluster(client: httpx.Client) -> None:
    """The same with two replicas: the router finds the stream's owner among them."""
    resume_and_stop(client)


def resume_and_stop(client: httpx.Client) -> None:
    """A stream resumed from its owner after its client left, then one stopped."""
    conv = "cluster/resume-me"
    body = chat("Tell me a story about a lighthouse.", 48, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body, headers={CONV: conv}) as resp:
        owner = resp.headers[REPLICA]
        next(line for line in resp.iter_lines() if '"content":"' in line)
    # The client left after its first token; the owner generates on. Wait for the end, then replay all.
    wait_until(lambda: lookup(client, conv) == [True], 120, "the stream done")
    full = client.get("/v1/stream", params={"conv_id": conv, "from": 0})
    assert full.status_code == 200 and full.headers[REPLICA] == owner
    assert full.text.endswith("data: [DONE]\n\n")
    assert client.get("/v1/stream", params={"conv_id": conv, "from": 10}).content == full.content[10:]
    whole = client.post("/v1/chat/completions", json={**body, "stream": False}).json()
    assert streamed_text(full.text) == whole["choices"][0]["message"]["content"]

    stopped = "cluster/stop-me"
    body = chat("Tell me a very long story about dragons.", 2000, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body, headers={CONV: stopped}) as resp:
        lines = resp.iter_lines()
        next(line for line in lines if '"content":"' in line)
        assert client.delete("/v1/stream", params={"conv_id": stopped}).status_code == 204
        assert "data: [DONE]" not in list(lines)  # the stop ended the original response too
    gone = client.get("/v1/stream", params={"conv_id": stopped})
    assert gone.status_code == 404


def streamed_text(sse: str) -> str:
    """The content deltas of a chat stream's events, joined."""
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: {")]
    return "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))


@pytest.mark.slow
def test_32_concurrent_chats_all_succeed_on_both_replicas(client: httpx.Client) -> None:
    def one(i: int) -> tuple[int, str]:
        reply = client.post("/v1/chat/completions", json=chat(f"Say a word about the number {i}."))
        assert reply.json()["choices"][0]["message"]["content"] is not None
        return reply.status_code, reply.headers[REPLICA]

    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(one, range(32)))
    assert [code for code, _ in results] == [200] * 32
    assert {replica for _, replica in results} == {"0", "1"}  # both replicas served


@pytest.mark.slow
def test_a_shared_long_system_prompt_lands_on_the_replica_that_cached_it(client: httpx.Client) -> None:
    first = client.post("/v1/chat/completions", json=chat("Where is book 14?", system=SYSTEM))
    assert first.status_code == 200, first.text
    holder = first.headers[REPLICA]
    n_prompt = first.json()["usage"]["prompt_tokens"]
    assert n_prompt > 9 * 64
    for question in ("Where is book 30?", "Where is book 99?", "Which aisle has shelf 3?", "Hi!"):
        reply = client.post("/v1/chat/completions", json=chat(question, system=SYSTEM))
        assert reply.status_code == 200, reply.text
        assert reply.headers[REPLICA] == holder
        assert reply.json()["timings"]["cache_n"] >= 9 * 64  # the system prompt came from the cache


def metrics(client: httpx.Client) -> dict[str, float]:
    """The /metrics samples: `name{labels}` -> value."""
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    samples = [line.rsplit(" ", 1) for line in reply.text.splitlines() if line and not line.startswith("#")]
    return {name: float(value) for name, value in samples}


@pytest.mark.slow
def test_cluster_metrics_count_placements_and_label_each_replicas_own(client: httpx.Client) -> None:
    before = metrics(client)
    sticky = 'llamba:cluster_placements_total{model="smollm2",reason="sticky"}'
    conv = {CONV: "cluster/metrics"}
    first = client.post("/v1/chat/completions", json=chat("Hi", stream=True), headers=conv)
    again = client.post("/v1/chat/completions", json=chat("Hi again"), headers=conv)  # a new turn: sticky
    assert first.status_code == again.status_code == 200
    assert again.headers[REPLICA] == first.headers[REPLICA]
    with ThreadPoolExecutor(4) as pool:
        assert [r.status_code for r in pool.map(lambda i: say_hi(client, i), range(4))] == [200] * 4
    after = metrics(client)
    assert after[sticky] == before[sticky] + 1
    placed = sum(
        after[f'llamba:cluster_placements_total{{model="smollm2",reason="{r}"}}'] for r in ("prefix", "load")
    )
    placed_before = sum(
        before[f'llamba:cluster_placements_total{{model="smollm2",reason="{r}"}}'] for r in ("prefix", "load")
    )
    assert placed == placed_before + 5  # the first turn and the four new chats
    served = [after[f'llamba:cluster_requests_total{{model="smollm2",replica="{i}"}}'] for i in (0, 1)]
    assert all(n > 0 for n in served)
    assert after['llamba:cluster_replicas_up{model="smollm2"}'] == 2
    assert after['llamba:cluster_replica_status{model="smollm2",replica="0",status="ready"}'] == 1
    assert 'llamba:cluster_replica_queue{model="smollm2",replica="1"}' in after
    assert after['llamba:cluster_replicas_desired{model="smollm2"}'] == 2  # no autoscaling: fixed at 2
    # Each replica's own metrics, labelled: its generated tokens count what it served.
    for i in (0, 1):
        tokens = after[f'llamacpp:tokens_predicted_total{{model="smollm2",replica="{i}"}}']
        assert tokens > 0
    text = client.get("/metrics").text
    assert text.count("# TYPE llamacpp:tokens_predicted_total ") == 1  # one head per family


@pytest.mark.slow
def test_killing_a_replica_fails_over_and_ray_replaces_it(
    cluster: ServerProcess, client: httpx.Client
) -> None:
    # A conversation on each replica. A new one goes to the least loaded replica, ties to the one that
    # served fewer requests: after the tests before, one may have served more, and every new
    # conversation goes to the other until they are even (six tries were not always enough).
    owners: dict[str, str] = {}
    for i in range(64):
        body = chat("Hi", stream=True)  # a stream: its session (and replay) lives on its replica
        reply = client.post("/v1/chat/completions", json=body, headers={CONV: f"cluster/kill-{i}"})
        owners.setdefault(reply.headers[REPLICA], f"cluster/kill-{i}")
        if len(owners) == 2:
            break
    assert set(owners) == {"0", "1"}
    for conv in owners.values():  # both replay before the kill
        assert client.get("/v1/stream", params={"conv_id": conv}).status_code == 200
    before = {str(r["index"]): r for r in replicas(cluster)}
    body = chat("Count from one to fifty in words.", 64, stream=True)
    with client.stream("POST", "/v1/chat/completions", json=body) as in_flight:
        survivor = in_flight.headers[REPLICA]
        victim = "1" if survivor == "0" else "0"
        lines = in_flight.iter_lines()
        next(line for line in lines if '"content":"' in line)
        os.kill(before[victim]["pid"], signal.SIGKILL)  # the replica's llamba-server, not its Ray actor
        rest = list(lines)
    assert "data: [DONE]" in rest  # the in-flight request on the other replica finished
    wait_until(lambda: replicas(cluster)[int(victim)]["status"] != "ready", 30, "the death detected")
    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(lambda i: say_hi(client, i), range(8)))
    assert [r.status_code for r in replies] == [200] * 8  # 0 5xx after detection
    replaced_already = replicas(cluster)[int(victim)]["restarts"] == 1
    assert replaced_already or {r.headers[REPLICA] for r in replies} == {survivor}
    lost = client.get("/v1/stream", params={"conv_id": owners[victim]})
    assert lost.status_code == 404  # its session died with its replica
    kept = client.get("/v1/stream", params={"conv_id": owners[survivor]})
    assert kept.status_code == 200
    # Ray restarts the actor, which starts a new server: the replica is back, a new process.
    wait_until(lambda: replicas(cluster)[int(victim)]["status"] == "ready", START_S, "the replica replaced")
    after = replicas(cluster)[int(victim)]
    assert after["restarts"] == 1 and after["pid"] != before[victim]["pid"]
    assert client.get("/v1/stream", params={"conv_id": owners[victim]}).status_code == 404
    assert metrics(client)['llamba:cluster_replicas_replaced_total{model="smollm2"}'] == 1
    with ThreadPoolExecutor(8) as pool:
        replies = list(
            pool.map(lambda i: client.post("/v1/chat/completions", json=chat(f"Hi {i}")), range(8))
        )
    assert [r.status_code for r in replies] == [200] * 8
    json.dumps(after)  # the /models entry stays plain JSON
