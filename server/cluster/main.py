"""`llamba-server --cluster ray...`: join (or start) a Ray cluster, place the model's replicas on it as
actors, and serve the cluster router in front of them with hypercorn.

The only module that imports Ray at module level; `server/__main__.py` imports it only with `--cluster`.
Ray Core actors rather than Ray Serve: docs/scale-out.md says why.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any

import ray
import structlog
from hypercorn.asyncio import serve

from server.cli import Settings
from server.cluster.app import create_cluster_app
from server.cluster.fleet import ReplicaHandle
from server.cluster.replica import ReplicaServer
from server.router.catalogue import CatalogueError, ModelEntry, build_catalogue
from server.router.main import child_args
from server.serving import hypercorn_config, served

log = structlog.get_logger("cluster")

# A replica whose child keeps dying is restarted by Ray without end: its log says why, and the router
# keeps serving from the others meanwhile.
MAX_RESTARTS = -1
# The cluster's own flags (and -m, given to each replica explicitly): replicas do not inherit them.
CLUSTER_ONLY_FLAGS = {"--cluster": True, "--replicas": True, "--placement": True, "-m": True, "--model": True}
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # Ray's minimum is 75 MiB; only actor calls' small answers use it
# The environment a replica's child needs from the router's (Ray's workers do not inherit the driver's).
PASSED_ENV = ("NUMBA_CACHE_DIR", "LLAMBA_NO_VNNI", "HOME", "TMPDIR", "CUDA_VISIBLE_DEVICES")


class RayReplica:
    """A replica's Ray actor behind the fleet's `ReplicaHandle`."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor

    async def describe(self) -> dict[str, Any]:
        return await self._actor.describe.remote()

    async def stop(self) -> Any:
        return await self._actor.stop.remote()

    def kill(self) -> None:
        ray.kill(self._actor, no_restart=True)


def ray_address(cluster: str) -> str | None:
    """`ray`: ray.init's own discovery (RAY_ADDRESS, the latest `ray start` here, else a new local
    instance); `ray:ADDRESS`: that address (`local`, `auto`, `HOST:PORT`); `ray://HOST:PORT`: Ray Client."""
    if cluster == "ray":
        return None
    return cluster if cluster.startswith("ray://") else cluster[len("ray:") :]


def model_entry(settings: Settings) -> ModelEntry:
    """`-m` when given, else the catalogue's default model (its preset flags included)."""
    if settings.model is not None:
        name = settings.alias or Path(settings.model).name
        return ModelEntry(id=name, model=settings.model, source="cli")
    return build_catalogue(settings.models_dir, settings.models_preset).default


def replica_args(entry: ModelEntry, argv: list[str]) -> list[str]:
    inherited = child_args(argv)
    kept: list[str] = []
    i = 0
    while i < len(inherited):
        flag, has_value = inherited[i].split("=", 1)[0], "=" in inherited[i]
        if flag in CLUSTER_ONLY_FLAGS:
            i += 2 if CLUSTER_ONLY_FLAGS[flag] and not has_value else 1
            continue
        kept.append(inherited[i])
        i += 1
    return ["-m", entry.model, "-a", entry.id, "--log-format", "json", *entry.args, *kept]


def start_replicas(
    settings: Settings, entry: ModelEntry, argv: list[str], secret: str
) -> list[ReplicaHandle]:
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env |= {**dict(entry.env), "LLAMA_ARG_API_KEY": secret}
    actor_class = ray.remote(ReplicaServer).options(  # type: ignore[attr-defined]
        num_cpus=settings.threads or 1,
        num_gpus=1 if settings.device == "cuda" else 0,
        max_restarts=MAX_RESTARTS,
        max_concurrency=4,  # describe answers while stop runs
    )
    args = replica_args(entry, argv)
    return [RayReplica(actor_class.remote(args, env)) for _ in range(settings.replicas)]


async def run_cluster(settings: Settings, argv: list[str]) -> int:
    try:
        entry = model_entry(settings)
    except CatalogueError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 2
    address = ray_address(settings.cluster or "ray")
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
    if address == "local":  # a new instance: no dashboard, and a small object store (tokens skip it)
        options |= {"include_dashboard": False, "object_store_memory": LOCAL_OBJECT_STORE_BYTES}
    context = ray.init(address=address, **options)
    gcs = (getattr(context, "address_info", None) or {}).get("gcs_address", address or "ray")
    secret = secrets.token_hex(16)
    handles = start_replicas(settings, entry, argv, secret)
    app = create_cluster_app(settings, entry, handles, secret, str(gcs))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "cluster.listening", host=settings.host, port=settings.port, model=entry.id, replicas=len(handles)
    )
    try:
        await serve(served(app, settings), hypercorn_config(settings), shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        ray.shutdown()
    return 0
