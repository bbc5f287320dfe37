"""`llamba-server --cluster ray...`: join (or start) a Ray cluster, place each served model's replicas
on it as actors, and serve the cluster router in front of them with hypercorn.

The served models: `-m` alone; else the catalogue's (`--models-dir`, `--models-preset`, the built-in
models) sections that set `replicas` (or `load-on-startup`), else its default model. Each model's
replica count is its preset's `replicas`, else `--replicas`; its autoscaling bounds its `replicas-min`
/ `replicas-max`, else the flags', else that count.

The only module that imports Ray at module level; `server/__main__.py` imports it only with `--cluster`.
Ray Core actors rather than Ray Serve: docs/scale-out.md says why.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import structlog
from hypercorn.asyncio import serve

from server.cluster.app import create_cluster_app
from server.cluster.autoscale import ScalePolicy
from server.cluster.monitor import ReplicaHandle
from server.cluster.replica import ReplicaServer
from server.config.replicas import replica_bounds
from server.config.settings import Settings
from server.http.serving import hypercorn_config, served
from server.router.catalogue import CatalogueError, ModelEntry, build_catalogue
from server.router.main import child_args

log = structlog.get_logger("cluster")

# A replica whose child keeps dying is restarted by Ray without end: its log says why, and the router
# keeps serving from the others meanwhile.
MAX_RESTARTS = -1
# The cluster's own flags (and -m, given to each replica explicitly): replicas do not inherit them.
CLUSTER_ONLY_FLAGS = {
    "--cluster": True,
    "--replicas": True,
    "--replicas-min": True,
    "--replicas-max": True,
    "--scale-up-after": True,
    "--scale-down-after": True,
    "--placement": True,
    "-m": True,
    "--model": True,
}
LOOPBACK = "127.0.0.1"
LOCAL_OBJECT_STORE_BYTES = 128 * 2**20  # Ray's minimum is 75 MiB; only actor calls' small answers use it
# The replicas' API key: a fresh secret per run, unless this variable sets it (for tools that must reach
# a replica directly, as scripts/bench_cluster.py measuring the router's own latency).
SECRET_ENV = "LLAMBA_CLUSTER_SECRET"
# The environment a replica's child needs from the router's (Ray's workers do not inherit the driver's).
PASSED_ENV = (
    "NUMBA_CACHE_DIR",
    "LLAMBA_CPU_LEVEL",
    "NUMBA_CPU_NAME",
    "NUMBA_CPU_FEATURES",
    "HOME",
    "TMPDIR",
    "CUDA_VISIBLE_DEVICES",
)


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


def replica_host(address: str | None) -> str | None:
    """Where the replicas listen: on loopback for `ray:local` (a Ray instance of this machine alone, that
    the router starts: nothing else needs to reach its replicas, so they are not on the network); on
    their node's IP (None) for any other cluster, whose router may be on another node."""
    return LOOPBACK if address == "local" else None


def served_models(settings: Settings) -> list[ModelEntry]:
    """`-m` when given; else the catalogue's entries with a `replicas` line or `load-on-startup`, else
    its default model (its preset flags included). The default model comes first."""
    if settings.model is not None:
        name = settings.alias or Path(settings.model).name
        return [ModelEntry(id=name, model=settings.model, source="cli")]
    catalogue = build_catalogue(settings.models_dir, settings.models_preset)
    chosen = [e for e in catalogue.entries.values() if e.replicas[0] is not None or e.load_on_startup]
    default = catalogue.default
    if not chosen:
        return [default]
    return sorted(chosen, key=lambda e: e.id != default.id)


def scaling(settings: Settings, entry: ModelEntry) -> tuple[ScalePolicy, int]:
    """The model's policy and initial replica count; CatalogueError naming the model when its bounds
    do not hold."""
    count, low, high = entry.replicas
    try:
        initial, low, high = replica_bounds(
            count or settings.replicas,
            low if low is not None else settings.replicas_min,
            high if high is not None else settings.replicas_max,
        )
    except ValueError as exc:
        raise CatalogueError(f"model {entry.id!r}: {exc}") from None
    policy = ScalePolicy(low, high, settings.scale_up_after, settings.scale_down_after)
    return policy, initial


def replica_threads(settings: Settings, entry: ModelEntry) -> int:
    """The CPU threads one replica uses (its preset's `threads`, else -t): its Ray CPU resources."""
    args = list(entry.args)
    for flag in ("-t", "--threads"):
        if flag in args[:-1]:
            value = args[args.index(flag) + 1]
            if value.isdigit() and int(value) > 0:
                return int(value)
    return settings.threads or 1


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


def replica_starter(
    settings: Settings, entry: ModelEntry, argv: list[str], secret: str, host: str | None = None
) -> Callable[[], ReplicaHandle]:
    """What starts one more replica of the model: a new Ray actor each call, its server bound to `host`
    (None: the node's IP, which a router on another node can reach)."""
    env = {k: os.environ[k] for k in PASSED_ENV if k in os.environ}
    env |= {**dict(entry.env), "LLAMA_ARG_API_KEY": secret}
    actor_class = ray.remote(ReplicaServer).options(  # type: ignore[attr-defined]
        num_cpus=replica_threads(settings, entry),
        num_gpus=1 if settings.device == "cuda" else 0,
        max_restarts=MAX_RESTARTS,
        max_concurrency=4,  # describe answers while stop runs
    )
    args = replica_args(entry, argv)
    return lambda: RayReplica(actor_class.remote(args, env, host))


async def run_cluster(settings: Settings, argv: list[str]) -> int:
    try:
        entries = served_models(settings)
        plans = [scaling(settings, entry) for entry in entries]
    except CatalogueError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 2
    address = ray_address(settings.cluster or "ray")
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": "WARNING"}
    if address == "local":  # a new instance: no dashboard, and a small object store (tokens skip it)
        options |= {"include_dashboard": False, "object_store_memory": LOCAL_OBJECT_STORE_BYTES}
    context = ray.init(address=address, **options)
    gcs = (getattr(context, "address_info", None) or {}).get("gcs_address", address or "ray")
    secret = os.environ.get(SECRET_ENV) or secrets.token_hex(16)
    host = replica_host(address)
    models = [
        (entry, replica_starter(settings, entry, argv, secret, host), policy, initial)
        for entry, (policy, initial) in zip(entries, plans, strict=True)
    ]
    app = create_cluster_app(settings, models, secret, str(gcs))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log.info(
        "cluster.listening",
        host=settings.host,
        port=settings.port,
        models={entry.id: initial for entry, _, _, initial in models},
    )
    try:
        await serve(served(app, settings), hypercorn_config(settings), shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    finally:
        ray.shutdown()
    return 0
