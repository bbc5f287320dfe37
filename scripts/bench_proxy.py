"""The router's proxy cost alone: CPU time of the router process per streamed event, without a model.

A stub child (a raw asyncio HTTP/1.1 server) answers every POST with an SSE stream of `--events` events,
one chunk each, emitted to all open streams together every `--interval-ms` (as an engine step emits one
token per sequence). The real router app (`create_router_app`, served by hypercorn) proxies `--streams`
concurrent streams to it; this process reads them. The figure is the router process's CPU time (user +
system, from /proc: what machine load does not change) per event, so a change to the proxy path can be
measured on a busy machine; `--direct` measures the same load sent to the stub itself (the client's side).

    .venv/bin/python scripts/bench_proxy.py [--streams 16] [--events 300] [--interval-ms 20]

PROXY_PROFILE=FILE writes a cProfile of the router process. The router runs on the event loop the
router picks (uvloop when installed; LLAMBA_EVENT_LOOP=asyncio|uvloop chooses), the stub and the client
on asyncio's, so a pair of runs compares the router's loops alone.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.server_process import free_port  # noqa: E402

RESPONSE_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" token"}}],"object":"chat.completion.chunk"}\n\n'


# -- the stub child --------------------------------------------------------------------------------------
async def stub_child(port: int, events: int, interval: float) -> None:
    tick = asyncio.Condition()

    async def clock() -> None:
        while True:
            await asyncio.sleep(interval)
            async with tick:
                tick.notify_all()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:  # keep-alive: one request after another, until the router closes the connection
            try:
                head = (await reader.readuntil(b"\r\n\r\n")).lower().split(b"\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            sizes = [int(line.split(b":")[1]) for line in head if line.startswith(b"content-length:")]
            await reader.readexactly(sizes[0] if sizes else 0)
            writer.write(RESPONSE_HEAD)
            for _ in range(events):
                async with tick:
                    await tick.wait()
                writer.write(b"%x\r\n%s\r\n" % (len(EVENT), EVENT))
            writer.write(b"0\r\n\r\n")
            await writer.drain()

    asyncio.get_running_loop().create_task(clock())
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


# -- the router, its one model's child being the stub -------------------------------------------------------
async def router(port: int, child_port: int) -> int:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from server.config.parse import parse_settings
    from server.router.app import create_router_app, router
    from server.router.catalogue import build_catalogue
    from server.router.state import LOADED

    settings, _ = parse_settings(["--port", str(port)])
    app = create_router_app(settings, build_catalogue(None, None), [])
    ctx = router(app)

    class StubChild:  # what the pool and the proxy read of a child: its URL; nothing to stop
        url = f"http://127.0.0.1:{child_port}"
        args: list[str] = []
        pid = None
        stopping = False

        async def stop(self, timeout: float) -> None:
            return None

    state = ctx.pool.states[ctx.catalogue.default_id]
    state.status, state.child = LOADED, StubChild()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    await serve(app, config)  # type: ignore[arg-type]
    return 0


def run_router(port: int, child_port: int) -> None:
    """The router on the event loop a router picks (LLAMBA_EVENT_LOOP; else uvloop when installed)."""
    from server.http import serving

    serving.run(router(port, child_port), serving.loop_factory(proxy=True))


# -- the client ----------------------------------------------------------------------------------------
def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_streams(url: str, streams: int) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=None, limits=httpx.Limits(max_connections=None)) as c:

        async def one() -> int:
            body = {"messages": [{"role": "user", "content": "Hi"}], "stream": True}
            n = 0
            async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    n += line.startswith("data: ")
            return n

        return sum(await asyncio.gather(*(one() for _ in range(streams))))


def spawn(role: str, *args: str) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            if role == "child":
                asyncio.run(stub_child(int(args[0]), int(args[1]), float(args[2])))
            elif os.environ.get("PROXY_PROFILE"):  # cProfile the router into that file
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
                try:
                    run_router(int(args[0]), int(args[1]))
                finally:
                    prof.disable()
                    prof.dump_stats(os.environ["PROXY_PROFILE"])
            else:
                run_router(int(args[0]), int(args[1]))
        finally:
            os._exit(0)
    return pid


def wait_up(url: str) -> None:
    for _ in range(200):
        try:
            httpx.get(url + "/health", timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise TimeoutError(url)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--events", type=int, default=300)
    p.add_argument("--interval-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    child_port, router_port = free_port(), free_port()
    child = spawn("child", str(child_port), str(args.events), str(args.interval_ms / 1000))
    proxy = spawn("router", str(router_port), str(child_port))
    try:
        wait_up(f"http://127.0.0.1:{router_port}")
        asyncio.run(read_streams(f"http://127.0.0.1:{router_port}", 2))  # warm: connections, imports
        for _ in range(args.rounds):
            before = cpu_seconds(proxy)
            events = asyncio.run(read_streams(f"http://127.0.0.1:{router_port}", args.streams))
            spent = cpu_seconds(proxy) - before
            print(
                f"router CPU {1e6 * spent / events:.0f} us per event ({events} events,"
                f" {args.streams} streams, load {os.getloadavg()[0]:.1f},"
                f" LLAMBA_EVENT_LOOP={os.environ.get('LLAMBA_EVENT_LOOP', 'auto')})",
                flush=True,
            )
    finally:
        os.kill(proxy, signal.SIGINT)  # hypercorn's serve ends on SIGINT: a profile gets written
        os.waitpid(proxy, 0)
        for pid in (child,):
            os.kill(pid, 9)
            os.waitpid(pid, 0)


if __name__ == "__main__":
    main()
