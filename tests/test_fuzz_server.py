"""The long fuzz of issue #20 (slow): schemathesis over /openapi.json, every operation, >= 2,000 cases;
1,000 random and malformed byte bodies on the POST routes; malformed SSE resume offsets. No 5xx, no
hang, every error in its route's shape, the server healthy after. The short version runs in
tests/test_openapi_server.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fuzz import FuzzReport, fuzz_openapi, fuzz_random_bodies, fuzz_resume_offsets
from tests.server_process import ServerProcess

# Thousands of requests on a shared 2-core machine: beyond pytest's default 600 s when it is loaded.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """-n 16 and 256-token slots bound every generation (a request's own limit wins over -n, as in
    llama-server, not over the slot's context), so thousands of cases take minutes; the
    slot-save folder lets the slot actions (and their filenames) be fuzzed too."""
    slots: Path = tmp_path_factory.mktemp("slots")
    proc = ServerProcess(
        "-m", "smollm2", "-np", "4", "-c", "1024", "-n", "16", "--metrics", "--slot-save-path", str(slots)
    ).wait_healthy()
    yield proc
    proc.stop()


def check(report: FuzzReport, url: str, least: int) -> None:
    print(json.dumps({"cases": report.cases, "statuses": report.statuses, "failures": report.failures[:20]}))
    assert report.cases >= least
    assert report.failures == [], f"{len(report.failures)} failures: {report.failures[:10]}"
    assert all("Unsatisfiable" in s for s in report.skipped), report.skipped  # nothing to make invalid
    assert httpx.get(url + "/health", timeout=10).status_code == 200


def test_schemathesis_over_the_document_finds_no_5xx(fuzzed: ServerProcess) -> None:
    check(fuzz_openapi(fuzzed.base_url, examples=80, seed=0), fuzzed.base_url, 2000)


def test_1000_random_bodies_find_no_5xx(fuzzed: ServerProcess) -> None:
    check(fuzz_random_bodies(fuzzed.base_url, count=1000, seed=0), fuzzed.base_url, 1000)


def test_malformed_resume_offsets_find_no_5xx(fuzzed: ServerProcess) -> None:
    check(fuzz_resume_offsets(fuzzed.base_url, count=300, seed=0), fuzzed.base_url, 600)
