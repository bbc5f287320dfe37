"""Load (issue #20): 64 concurrent clients x 8 mixed requests (chat whole and streamed, completions,
tokenize, a resumable stream resumed after a dropped connection, a stream cancelled mid-way) on
SmolLM2 -np 4: nothing lost, no 5xx, every stream ends with [DONE] or an error event, the server
healthy after. scripts/bench_load.py is the same run as a benchmark (it prints latency and waits)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from scripts.bench_load import SERVER_FLAGS, run_load
from tests.server_process import ServerProcess


@pytest.mark.slow
@pytest.mark.timeout(3600)  # 512 requests on a shared 2-core machine: minutes, more under load
def test_64_clients_of_8_mixed_requests_lose_nothing() -> None:
    server = ServerProcess(*SERVER_FLAGS).wait_healthy(300)
    try:
        report = asyncio.run(run_load(server.base_url, clients=64, requests=8))
        summary = report.summary()
        print(json.dumps(summary, indent=2))
        assert summary["requests"] == summary["expected"] == 512
        assert summary["lost"] == 0, summary["lost_examples"]
        assert summary["status_5xx"] == 0 and summary["status_503"] == 0
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    finally:
        server.stop()
