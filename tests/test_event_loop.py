"""The event loop a process runs on (server/http/serving.py): a router's or cluster's front on uvloop when
it is installed, a model server on asyncio's (its MCP children need asyncio's pipe transports), unless
LLAMBA_EVENT_LOOP names one; a bad name refused at start. Servers on each loop: tests/test_mcp_server.py
(MCP children, signals) and tests/test_mcp_transport.py (the transport); routers on uvloop:
tests/test_router_server.py and tests/test_metrics_server.py."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from server.http.serving import loop_factory, run
from tests.conftest import require
from tests.server_process import REPO, ServerProcess


async def loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__


def test_the_loop_each_process_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    require(None if importlib.util.find_spec("uvloop") else "uvloop is missing (the test extra)")
    monkeypatch.delenv("LLAMBA_EVENT_LOOP", raising=False)
    assert run(loop_module(), loop_factory(proxy=True)) == "uvloop"  # installed: a router's default
    assert loop_factory(proxy=False) is None  # a model server's: asyncio's own
    assert run(loop_module(), loop_factory(proxy=False)).startswith("asyncio")
    monkeypatch.setenv("LLAMBA_EVENT_LOOP", "uvloop")
    assert run(loop_module(), loop_factory(proxy=False)) == "uvloop"
    monkeypatch.setenv("LLAMBA_EVENT_LOOP", "asyncio")
    assert loop_factory(proxy=True) is None
    with pytest.raises(ValueError, match="LLAMBA_EVENT_LOOP must be one of auto, asyncio, uvloop"):
        loop_factory(proxy=True, choice="trio")


def test_a_bad_loop_name_stops_the_server_at_start() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "server", "-m", "smollm2"], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "LLAMBA_EVENT_LOOP": "uv"}, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "error: LLAMBA_EVENT_LOOP must be one of auto, asyncio, uvloop, got 'uv'" in done.stderr


def test_a_router_on_uvloop_proxies_a_chat_to_its_child(tmp_path: Path) -> None:
    require(None if importlib.util.find_spec("uvloop") else "uvloop is missing (the test extra)")
    preset = tmp_path / "models.ini"
    preset.write_text("version = 1\n[smol]\nmodel = smollm2\nc = 512\n")
    env = {k: v for k, v in os.environ.items() if k != "LLAMBA_EVENT_LOOP"}
    router = ServerProcess("--models-preset", str(preset), env=env).wait_healthy()
    try:
        body = {"model": "smol", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        reply = httpx.post(router.base_url + "/v1/chat/completions", json=body, timeout=240)
        assert reply.status_code == 200, reply.text
        assert "loop=uvloop" in router.log_path.read_text()  # the router's (its child: asyncio's, above)
    finally:
        router.stop()
