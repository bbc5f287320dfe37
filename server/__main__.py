"""`python -m server` == `llamba-server`: parse llama-server's flags and serve with hypercorn."""

from __future__ import annotations

import asyncio
import functools
import signal
import sys

import anyio
import structlog
from hypercorn.asyncio import serve
from quart import Quart

from engine.cpu import isa
from engine.model_files import ModelFetchError, resolve
from server.app import create_app
from server.config.ignored_flags import NO_EFFECT, Ignored
from server.config.parse import parse_settings
from server.config.settings import Settings
from server.http import logs, serving
from server.http.serving import hypercorn_config, served
from server.state import AppState
from server.streams.journal import JournalError

log = structlog.get_logger("server")


def _log_fetch(message: str) -> None:
    """A part of a known model being fetched (a router turns it into `download_progress`)."""
    log.info("model.fetch", message=message)


def _log_output(settings: Settings) -> logs.LogOutput:
    return logs.LogOutput(
        settings.verbosity,
        settings.log_file,
        settings.log_disable,
        settings.log_colors,
        settings.log_prefix,
        settings.log_timestamps,
        settings.log_jsonl,
    )


async def run(settings: Settings, ignored: list[Ignored], argv: list[str] | None = None) -> int:
    logs.configure(settings.log_format, settings.verbose, _log_output(settings))
    try:  # the kernels' x86 level, as llama-server prints its `CPU : AVX2 = 1 | ...` line
        cpu = isa.current().describe()
    except isa.UnsupportedTarget as exc:  # one line and nothing else: the start stops here
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 1
    log.info("server.event_loop", loop=type(asyncio.get_running_loop()).__module__)
    for flag in ignored:
        log.warning("cli.flag_ignored", flag=str(flag), reason=getattr(flag, "reason", NO_EFFECT))
    log.info("system_info", cpu=cpu)
    if settings.model is not None and (settings.models_dir or settings.models_preset):
        log.warning("cli.flag_ignored", flag="--models-dir/--models-preset", reason="-m serves one model")
    if settings.cluster is not None:  # replicas placed by Ray behind one router (Ray imported only here)
        from server.cluster.main import run_cluster

        return await run_cluster(settings, list(sys.argv[1:] if argv is None else argv))
    if settings.model is None:  # no -m: a router of many models, one child server each
        from server.router.main import run_router

        return await run_router(settings, list(sys.argv[1:] if argv is None else argv))
    try:
        model_path = await anyio.to_thread.run_sync(resolve, settings.model, _log_fetch)
    except ModelFetchError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 1
    # The model's API name without -a is -m as given (a path, or a built-in model's name), as
    # llama-server makes it the alias; the resolved file is what loads.
    settings = settings.model_copy(
        update={"model": str(model_path), "alias": settings.alias or settings.model}
    )
    stop = asyncio.Event()
    exit_code = 0

    def load_failed() -> None:
        nonlocal exit_code
        exit_code = 1
        stop.set()

    try:
        app = create_app(settings, on_load_failure=load_failed)
    except JournalError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        return 2
    forced = _on_signals(stop)

    log.info("server.listening", host=settings.host, port=settings.port, model=str(model_path))
    shutdown = functools.partial(_shut_down, app, settings.shutdown_timeout, stop, forced)
    await serve(served(app, settings), hypercorn_config(settings), shutdown_trigger=shutdown)  # type: ignore[arg-type]
    return exit_code


def _on_signals(stop: asyncio.Event) -> asyncio.Event:
    """SIGTERM/SIGINT: the first sets `stop`; a second sets the event returned (cancel what runs, now)."""
    forced = asyncio.Event()

    def on_signal() -> None:
        (forced if stop.is_set() else stop).set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    return forced


async def _shut_down(app: Quart, timeout: float, stop: asyncio.Event, forced: asyncio.Event) -> None:
    """hypercorn's shutdown trigger: after `stop`, let in-flight requests finish for up to `timeout`
    seconds (--shutdown-timeout; new ones get 503), then end what still runs, so open streams finish and
    connections drain at once. MCP children too, before the HTTP drain: a slow tool call then answers at
    once instead of holding it."""
    await stop.wait()
    state = AppState.of(app)
    model = state.model
    if timeout > 0:
        await model.drain(timeout, forced)
    # Before the engine stops: the generations it cancels must not end their journals (they resume).
    state.sessions.detach_journals()
    mcp = state.toolbox
    await asyncio.gather(
        anyio.to_thread.run_sync(model.stop),
        mcp.stop() if mcp else asyncio.sleep(0),
    )


def main(argv: list[str] | None = None) -> None:
    settings, ignored = parse_settings(argv)
    try:  # a router's or a cluster's front proxies; a model server runs the model (and MCP children)
        factory = serving.loop_factory(proxy=settings.model is None or settings.cluster is not None)
    except ValueError as exc:
        print(f"llamba-server: error: {exc}", file=sys.stderr)
        sys.exit(2)
    sys.exit(serving.run(run(settings, ignored, argv), factory))


if __name__ == "__main__":
    main()
