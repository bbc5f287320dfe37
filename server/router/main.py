"""`llamba-server` without `-m`: the router process (catalogue, children, proxy), served by hypercorn."""

from __future__ import annotations

import asyncio
import signal
import sys

import structlog
from hypercorn.asyncio import serve

from server.config.settings import Settings
from server.http.serving import hypercorn_config, served
from server.router.app import create_router_app
from server.router.catalogue import CatalogueError, build_catalogue

log = structlog.get_logger("router")

# The router's own flags, which its children must not get (flag: takes a value). Children inherit every
# other flag of the router's command line, as llama-server's do, after their preset's.
ROUTER_ONLY_FLAGS = {
    "--host": True,
    "--port": True,
    "--api-key": True,
    "--api-key-file": True,
    "--models-dir": True,
    "--models-preset": True,
    "--models-max": True,
    "--models-autoload": False,
    "--no-models-autoload": False,
    "-a": True,
    "--alias": True,
    "--log-format": True,
    # One log file per process (children would truncate it); a child's log must reach its router.
    "--log-file": True,
    "--log-disable": False,
    "--responses-dir": True,  # one folder per process: children would overwrite each other's files
    "--api-prefix": True,  # the router serves under the prefix and over TLS; children plain, at the root
    "--ssl-key-file": True,
    "--ssl-cert-file": True,
}


def child_args(argv: list[str]) -> list[str]:
    kept: list[str] = []
    i = 0
    while i < len(argv):
        flag, has_value = argv[i].split("=", 1)[0], "=" in argv[i]
        if flag in ROUTER_ONLY_FLAGS:
            i += 2 if ROUTER_ONLY_FLAGS[flag] and not has_value else 1
            continue
        kept.append(argv[i])
        i += 1
    return kept


async def run_router(settings: Settings, argv: list[str]) -> int:
    try:
        catalogue = build_catalogue(settings.models_dir, settings.models_preset)
    except CatalogueError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 2
    app = create_router_app(settings, catalogue, child_args(argv))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    models = sorted(catalogue.entries)
    log.info(
        "router.listening",
        host=settings.host,
        port=settings.port,
        models=models,
        models_max=settings.models_max,
    )
    await serve(served(app, settings), hypercorn_config(settings), shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    return 0
