"""Shared fixtures: the real model files (fetched on first use) and the golden data from llama.cpp."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import pytest

import engine  # noqa: F401  (pins Numba's settings before anything imports numba)
from engine.cpu import isa
from engine.gguf import GGUFFile
from engine.model_files import resolve
from tests import reaper

# llama.cpp's reference outputs, kept in the repository (tests/golden/README.md says where they come from).
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"


# The long English text of the perplexity figures and the long-text tokenizer checks (Debian's base-files).
GPL3 = Path("/usr/share/common-licenses/GPL-3")
CACHED_AT_START = pytest.StashKey[int]()
# level name -> how tests/test_cpu_levels.py tested it
LEVELS_TESTED = pytest.StashKey[dict[str, str]]()
REAPER = pytest.StashKey["subprocess.Popen[bytes]"]()
EMPTY_CACHE = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    """Start the session's reaper (tests/reaper.py) before any test starts a process, and put its token
    in the environment every such process inherits: when this interpreter ends, however it ends (an
    abort, a SIGKILL, a failed fixture), the reaper kills whatever the tests left running."""
    token = secrets.token_hex(8)
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", str(Path(reaper.__file__)), token],
        stdin=subprocess.PIPE,
        env={k: v for k, v in os.environ.items() if k != reaper.ENV},
        start_new_session=True,
    )
    os.environ[reaper.ENV] = f"{os.environ.get(reaper.ENV, '')} {token}".strip()
    config.stash[REAPER] = proc
    # An empty llama.cpp model cache (engine/hf_cache.py): the developer's own must not change what a
    # router lists or loads in a test; tests of the cache point LLAMA_CACHE at their own.
    config.stash[EMPTY_CACHE] = os.environ["LLAMA_CACHE"] = tempfile.mkdtemp(prefix="llamba-llama-cache-")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The normal end: the reaper kills what is left (a line each on stderr: a leak to fix) and exits."""
    with contextlib.suppress(OSError):  # empty unless a test wrote into it
        os.rmdir(config.stash.get(EMPTY_CACHE, ""))
    proc = config.stash.get(REAPER, None)
    if proc is None or proc.stdin is None:
        return
    proc.stdin.close()
    with contextlib.suppress(subprocess.TimeoutExpired):  # past that, it goes on alone
        proc.wait(30)


def _cached_kernels() -> int:
    cache = os.environ.get("NUMBA_CACHE_DIR")
    return sum(1 for _ in Path(cache).rglob("*.nbc")) if cache else 0


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[CACHED_AT_START] = _cached_kernels()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Whether this run found the JIT cache warm (a cold one compiles for minutes: engine/jit_cache.py),
    the CPU levels it tested, and what it skipped and why (a skip in the middle of -ra's list is easy to
    miss; here each reason is one line under its kind)."""
    start = config.stash.get(CACHED_AT_START, 0)
    terminalreporter.write_line(
        f"JIT cache {os.environ.get('NUMBA_CACHE_DIR')}: {start} compiled kernels at the start, "
        f"{_cached_kernels() - start} compiled by this run"
    )
    terminalreporter.write_line(isa.current().describe())
    tested = config.stash.get(LEVELS_TESTED, {})
    if tested:
        terminalreporter.write_line("CPU levels tested: " + "; ".join(f"{k}: {v}" for k, v in tested.items()))
        untested = [name for name in isa.LEVEL_NAMES if name not in tested]
        if untested:
            terminalreporter.write_line(
                f"CPU levels not tested (this CPU cannot execute them): {', '.join(untested)}"
            )
    for line in skipped_summary(terminalreporter.stats.get("skipped", [])):
        terminalreporter.write_line(line)


def load_golden(name: str) -> dict[str, Any]:
    """llama.cpp's outputs tests/golden/NAME.json (a module that calls this runs on every level)."""
    return json.loads(golden_file(f"{name}.json").read_text())


def golden_file(name: str) -> Path:
    """tests/golden/NAME: the one way a test reaches llama.cpp's outputs (see EVERY_LEVEL)."""
    return GOLDEN_DIR / name


# Every test that compares with llama.cpp's outputs runs on every CPU level the machine executes
# (tests/test_cpu_levels.py runs `-m every_level` once per level, each compiled for its own target): an
# answer that matches llama.cpp on one level only is a bug (issue 48: Gemma 3's embeddings passed at
# avx512-vnni and failed at avx2). Nobody has to remember it: a test module that reads tests/golden
# (through load_golden or golden_file; tests/test_suite_rules.py refuses any other way) has all its tests
# marked. A module whose answers cannot depend on the level (no kernel runs: tokenizers, templates,
# parsers) says why in LEVEL_INDEPENDENT and is left out; kernel tests against numpy opt in with
# `pytestmark = pytest.mark.every_level`.
EVERY_LEVEL = "every_level"
READS_GOLDENS = re.compile(r"\b(?:load_golden|golden_file)\(")


@functools.cache
def reads_goldens(path: str) -> bool:
    return bool(READS_GOLDENS.search(Path(path).read_text()))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = getattr(item, "module", None)
        if module and reads_goldens(module.__file__) and not hasattr(module, "LEVEL_INDEPENDENT"):
            item.add_marker(EVERY_LEVEL)


# Every skip says which of two kinds it is, and the run's summary lists both (pytest_terminal_summary):
# a missing prerequisite (require(): software or data a developer may lack; fails under CI=true) or a test
# that cannot apply on this machine whatever is installed (not_applicable(): the CPU cannot execute a
# level's instructions, a GPU is present where the test checks the answer of a machine without one).
# tests/test_suite_rules.py fails on a skip or xfail anywhere else in tests/.
MISSING = "missing prerequisite: "
NOT_APPLICABLE = "cannot apply on this machine: "


def require(missing: str | None) -> None:
    """Stop a test whose prerequisite is missing; `missing` says what (None: nothing is, carry on).

    Outside CI the test skips and says why. Under CI=true it fails: a CI run must run every test, and a
    quiet skip there would hide a broken set-up (no Chromium, no CUDA simulator). At module level (during
    collection) the failure is a collection error, which fails the run too.
    """
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{missing} (CI=true: a missing prerequisite fails the run)", pytrace=False)
    pytest.skip(MISSING + missing, allow_module_level=True)


def not_applicable(why: str) -> NoReturn:
    """Skip a test that has nothing to check on this machine, on CI or not; `why` names the machine's
    property (never a missing package or file: those go through require())."""
    pytest.skip(NOT_APPLICABLE + why)


def applies_only(condition: bool, why: str) -> pytest.MarkDecorator:
    """not_applicable() as a mark: skip the test unless `condition` holds on this machine."""
    return pytest.mark.skipif(not condition, reason=NOT_APPLICABLE + why)


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return reason.removeprefix("Skipped: ")


def skipped_summary(reports: list[pytest.TestReport | pytest.CollectReport]) -> list[str]:
    """The summary's lines on what this run skipped: each reason once, with how many tests and which
    (the first three), under its kind; a skip of neither kind is listed as a fault of the suite."""
    by_reason: dict[str, list[str]] = {}
    for report in reports:
        by_reason.setdefault(_skip_reason(report), []).append(report.nodeid)
    if not by_reason:
        return ["Skipped: nothing"]
    lines = [f"Skipped: {sum(len(ids) for ids in by_reason.values())} tests"]
    kinds = [(MISSING, "missing prerequisites (CI=true fails these)"), (NOT_APPLICABLE, "cannot apply here")]
    kinds.append(("", "FAULT, a skip that is neither (tests/conftest.py says how to skip)"))
    for prefix, title in kinds:
        reasons = {r: ids for r, ids in by_reason.items() if r.startswith(prefix)}
        for reason in reasons:
            del by_reason[reason]
        if reasons:
            lines.append(f"  {title}:")
        for reason, ids in sorted(reasons.items()):
            more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
            lines.append(f"    {len(ids)} x {reason.removeprefix(prefix)}: {', '.join(ids[:3])}{more}")
    return lines


def gpl3_text() -> str:
    require(None if GPL3.is_file() else f"{GPL3} is missing (Debian's base-files package ships it)")
    return GPL3.read_text()


@pytest.fixture(scope="session")
def smollm2_gguf() -> GGUFFile:
    return GGUFFile(resolve("smollm2"))


@pytest.fixture(scope="session")
def gemma3_gguf() -> GGUFFile:
    return GGUFFile(resolve("gemma3"))


@pytest.fixture(scope="session")
def smollm2_llm():  # type: ignore[no-untyped-def]
    from engine.llm import LLM

    return LLM.load("smollm2")


@pytest.fixture(scope="session")
def gemma3_llm():  # type: ignore[no-untyped-def]
    from engine.llm import LLM

    return LLM.load("gemma3")


@pytest.fixture(scope="session")
def server():  # type: ignore[no-untyped-def]
    """One SmolLM2 server shared by the end-to-end tests: 4 slots of 1024 tokens, metrics on."""
    from tests.server_process import ServerProcess

    proc = ServerProcess("-m", "smollm2", "-np", "4", "-c", "4096", "--metrics").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def gemma_server():  # type: ignore[no-untyped-def]
    """One Gemma 3 server (built-in gemma chat template) for the end-to-end tests that run both models."""
    from tests.server_process import ServerProcess

    proc = ServerProcess("-m", "gemma3", "--chat-template", "gemma", "-np", "4", "-c", "4096").wait_healthy()
    yield proc
    proc.stop()


@pytest.fixture(params=["smollm2", "gemma3"])
def any_server(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """The shared SmolLM2 server, then the Gemma 3 one."""
    return request.getfixturevalue("server" if request.param == "smollm2" else "gemma_server")


@pytest.fixture(scope="session")
def limited_server():  # type: ignore[no-untyped-def]
    """SmolLM2 with small request limits (issue #20's tests), -n 8 and 256-token slots, so fuzzed
    generations are short whatever max_tokens they carry (a request's own limit wins over -n, as in
    llama-server, but not over the slot's context)."""
    from tests.server_process import ServerProcess

    proc = ServerProcess(
        "-m", "smollm2", "-np", "2", "-c", "512", "-n", "8", "--max-body-size", "16384",
        "--max-json-depth", "16", "--header-timeout", "1", "--max-header-size", "4096",
    ).wait_healthy()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def qwen_server():  # type: ignore[no-untyped-def]
    """One Qwen2.5-Coder 1.5B server for the tests of what only it has (FIM tokens for /infill's
    llama.cpp goldens, a template with Hermes' `<tool_call>` format): its start (~25 s on two busy
    cores, most of it repacking 1.1 GB of weights) is paid once. One slot of 4096 tokens: the slot
    tests/golden/infill.json was made with (a smaller one leaves /infill no room for its repo-name chunk)."""
    from tests.server_process import ServerProcess

    proc = ServerProcess("-m", "qwen2.5-coder", "-c", "4096", "-np", "1").wait_healthy(timeout=600)
    yield proc
    proc.stop()
