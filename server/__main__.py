"""`python -m server` == `llamba-server`: parse llama-server's flags and serve with hypercorn."""

from __future__ import annotations

import asyncio
import signal
import sys

import anyio
import structlog
from hypercorn.asyncio import serve
from hypercorn.config import Config

from engine.model_files import ModelFetchError, resolve
from server import logs
from server.app import create_app
from server.cli import parse_settings
from server.routes.tools import MANAGER_KEY as MCP_KEY
from server.service import EXTENSION_KEY as SERVICE_KEY

log = structlog.get_logger("server")


def _log_fetch(message: str) -> None:
    """A part of a known model being fetched (a router turns it into `download_progress`)."""
    log.info("model.fetch", message=message)


async def run(argv: list[str] | None = None) -> int:
    settings, ignored = parse_settings(argv)
    logs.configure(settings.log_format, settings.verbose)
    for flag in ignored:
        log.warning(
            "cli.flag_ignored", flag=flag, reason="accepted for llama-server compatibility, no effect here"
        )
    if settings.model is not None and (settings.models_dir or settings.models_preset):
        log.warning("cli.flag_ignored", flag="--models-dir/--models-preset", reason="-m serves one model")
    if settings.model is None:  # no -m: a router of many models, one child server each
        from server.router.main import run_router

        return await run_router(settings, list(sys.argv[1:] if argv is None else argv))
    try:
        model_path = await anyio.to_thread.run_sync(resolve, settings.model, _log_fetch)
    except ModelFetchError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 1
    settings = settings.model_copy(update={"model": str(model_path)})
    stop = asyncio.Event()
    exit_code = 0

    def load_failed() -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    app = create_app(settings, on_load_failure=load_failed)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def shutdown_trigger() -> None:
        await stop.wait()
        # End in-flight generations first so open streams finish and connections drain at once.
        # MCP children too, before the drain: a slow tool call then answers at once instead of holding it.
        mcp = app.extensions.get(MCP_KEY)
        await asyncio.gather(
            anyio.to_thread.run_sync(app.extensions[SERVICE_KEY].stop),
            mcp.stop() if mcp else asyncio.sleep(0),
        )

    config = Config()
    config.bind = [f"{settings.host}:{settings.port}"]
    config.graceful_timeout = 1.0
    config.accesslog = None
    log.info("server.listening", host=settings.host, port=settings.port, model=str(model_path))
    await serve(app, config, shutdown_trigger=shutdown_trigger)  # type: ignore[arg-type]
    return exit_code


def main(argv: list[str] | None = None) -> None:
    sys.exit(asyncio.run(run(argv)))


if __name__ == "__main__":
    main()
