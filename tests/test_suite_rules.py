"""The suite's own rules, checked on the suite: a test session leaves no process behind however it ends
(tests/reaper.py), every skip is of a declared kind and the run's summary lists it (tests/conftest.py),
and every test asserts something. The session checks run real pytest sessions in subprocesses."""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.server_process import LIVENESS_S, REPO, process_alive, wait_until

TESTS = REPO / "tests"
# An inner session's start and a SmolLM2 server's load on two busy cores: a bound on work, not liveness.
START_S = 300.0

HOLDS_A_SERVER = """
import os
import subprocess
import time
from pathlib import Path

from tests.server_process import ServerProcess


def test_holds_a_server_then_is_killed() -> None:
    server = ServerProcess("-m", "smollm2", "-c", "512", "-np", "1").wait_healthy()
    # and a process that left the session's process group and session, as MCP servers do
    loner = subprocess.Popen(["setsid", "sleep", "3600"])
    pids = Path(os.environ["PIDS_FILE"])
    pids.with_suffix(".tmp").write_text(f"{server.proc.pid} {loner.pid}")
    pids.with_suffix(".tmp").rename(pids)
    time.sleep(3600)
"""


def inner_session(test_file: Path, env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """pytest on `test_file` with the suite's conftest (its reaper, its summary), as `make test` runs."""
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", str(test_file)]
    with log.open("wb") as out:
        return subprocess.Popen(
            cmd, cwd=REPO, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT
        )


def test_a_sigkilled_session_leaves_no_process_behind(tmp_path: Path) -> None:
    """The interpreter killed mid-test (no teardown, no atexit): its real server and a process in a
    session of its own are gone within the liveness bound all the same."""
    test_file, pids_file, log = tmp_path / "test_inner.py", tmp_path / "pids", tmp_path / "inner.log"
    test_file.write_text(HOLDS_A_SERVER)
    session = inner_session(test_file, {"PIDS_FILE": str(pids_file)}, log)
    pids: list[int] = []
    try:
        wait_until(lambda: pids_file.exists() or session.poll() is not None, START_S, "the inner server up")
        assert session.poll() is None, log.read_text()[-4000:]
        pids = [int(p) for p in pids_file.read_text().split()]
        assert all(process_alive(p) for p in pids)
        session.send_signal(signal.SIGKILL)
        session.wait()
        wait_until(
            lambda: not any(process_alive(p) for p in pids), LIVENESS_S, "the session's processes gone"
        )
    finally:
        session.kill()
        for pid in filter(process_alive, pids):  # a failure here must not leak them either
            os.kill(pid, signal.SIGKILL)


SKIPS = """
import pytest

from tests.conftest import not_applicable, require


def test_missing() -> None:
    require("the frobnicator is not installed")


def test_missing_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    require("the frobnicator is not installed")


def test_elsewhere() -> None:
    not_applicable("this machine has no frobnicator socket")


def test_bare() -> None:
    pytest.skip("for no declared reason")


def test_runs() -> None:
    assert True
"""


def test_the_summary_lists_each_skip_under_its_kind_and_ci_fails_a_missing_prerequisite(
    tmp_path: Path,
) -> None:
    test_file = tmp_path / "test_skips.py"
    test_file.write_text(SKIPS)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", str(test_file)]
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=START_S)
    out = run.stdout
    assert run.returncode == 1 and "1 failed, 1 passed, 3 skipped" in out, out
    assert "the frobnicator is not installed (CI=true: a missing prerequisite fails the run)" in out, out
    summary = out[out.index("\nSkipped: 3 tests\n") :]
    assert "  missing prerequisites (CI=true fails these):\n    1 x the frobnicator is not" in summary, out
    assert "  cannot apply here:\n    1 x this machine has no frobnicator socket: " in summary, out
    assert "  FAULT, a skip that is neither" in summary and "1 x for no declared reason" in summary, out


def suite_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if p.name != "conftest.py")


def test_every_skip_goes_through_require_or_not_applicable() -> None:
    """No pytest.skip / importorskip / xfail / skip marks outside tests/conftest.py: require() fails a
    missing prerequisite under CI=true, not_applicable() / applies_only() say why a test cannot apply."""
    banned = {"skip", "skipif", "importorskip", "xfail"}
    found = []
    for path in suite_files():
        nodes = list(ast.walk(ast.parse(path.read_text())))
        # `pytest.skip.Exception` (what a test of require() expects pytest.raises to catch) is no skip
        caught = {id(n.value) for n in nodes if isinstance(n, ast.Attribute) and n.attr == "Exception"}
        for node in nodes:
            skips = isinstance(node, ast.Attribute) and node.attr in banned and id(node) not in caught
            if skips and ast.unparse(node.value) in ("pytest", "pytest.mark"):  # type: ignore[attr-defined]
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], "\n".join(found)


def _asserting_functions(trees: list[ast.Module]) -> set[str]:
    """Names of the functions in the suite that assert: directly (assert, pytest.raises / fail, an
    assert_* call, check=True, a raise) or through a call to another such function, to a fixed point."""
    defs: dict[str, list[ast.AST]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                defs.setdefault(node.name, []).append(node)
    calls = {name: {c for node in nodes for c in _called(node)} for name, nodes in defs.items()}
    asserting = {name for name, nodes in defs.items() if any(_asserts_itself(n) for n in nodes)}
    while grown := {n for n, called in calls.items() if n not in asserting and called & asserting}:
        asserting |= grown
    return asserting


def _called(node: ast.AST) -> set[str]:
    names = set()
    for call in ast.walk(node):
        if isinstance(call, ast.Call):
            func = call.func
            names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def _asserts_itself(node: ast.AST) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Assert | ast.Raise):
            return True
        if isinstance(inner, ast.keyword) and inner.arg == "check" and ast.unparse(inner.value) == "True":
            return True
    return any(name.startswith("assert") or name in ("raises", "fail", "warns") for name in _called(node))


def test_every_test_asserts_something() -> None:
    """A test with no assertion passes whatever the code does (tests/test_suite_rules.py's own scan)."""
    trees = {path: ast.parse(path.read_text()) for path in suite_files()}
    asserting = _asserting_functions(list(trees.values()))
    silent = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if (
                is_function
                and node.name.startswith("test_")
                and not (_asserts_itself(node) or _called(node) & asserting)
            ):
                silent.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.name}")
    assert silent == [], "\n".join(silent)


def test_goldens_are_read_through_the_conftest() -> None:
    """A test reaches llama.cpp's outputs through load_golden or golden_file only: that is how
    tests/conftest.py finds the modules whose tests must run on every CPU level (EVERY_LEVEL)."""
    elsewhere = []
    for path in sorted(TESTS.glob("*.py")):
        if path.name in ("conftest.py", Path(__file__).name):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("golden", "tests/golden"):
                elsewhere.append(f"{path.name}:{node.lineno}")
    assert elsewhere == []


MAX_TRACKED_BYTES = 5 * 1024 * 1024  # models, builds and caches never go into git; vendored files stay small


def test_no_tracked_file_is_over_5_mib() -> None:
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    paths = [REPO / name for name in tracked.decode().split("\0") if name]
    large = [str(p.relative_to(REPO)) for p in paths if p.is_file() and p.stat().st_size > MAX_TRACKED_BYTES]
    assert not large, f"tracked files over 5 MiB: {large}"
