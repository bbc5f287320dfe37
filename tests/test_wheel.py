"""The installable wheel: built from this checkout, installed (not editable) into a fresh virtual environment,
its llamba-server serves the web UI and answers a chat completion, importing nothing from the source tree.

Slow (minutes): a new environment, its dependencies from the package index or pip's cache, and a cold Numba
compile (the installed engine's files are new paths to Numba's cache).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.server_process import REPO, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

WEBUI = REPO / "server" / "webui"
PACKAGES = {"cli", "engine", "server"}
STARTUP_TIMEOUT_S = 600.0  # model load and a cold Numba compile of every kernel, on two busy cores


@dataclass(frozen=True)
class Installed:
    wheel: Path
    venv: Path
    workdir: Path  # outside the checkout: the server's working directory
    env: dict[str, str]

    def python(self, code: str) -> str:
        """Run code with the installed environment's Python, as the server runs, and return its stdout."""
        cmd = [str(self.venv / "bin" / "python"), "-c", code]
        return subprocess.run(
            cmd, cwd=self.workdir, env=self.env, check=True, capture_output=True, text=True
        ).stdout


def _run(*cmd: str | Path) -> None:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def _clean_source_copy(dest: Path) -> Path:
    """The files git sees in the checkout (tracked, or new and not ignored), copied to dest. setuptools builds
    inside the source folder and packs whatever its build/lib holds (a stray build/lib/cli/x.py lands in the
    wheel): built in the checkout, the wheel could hold files deleted since and pass where a clone fails."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if source.is_file():  # a tracked file deleted in the working tree is not part of it
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def _server_env(workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    # A cache of its own: the compiled kernels of a throwaway install would only pile up in the user's one.
    env["NUMBA_CACHE_DIR"] = str(workdir / "numba-cache")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    root = tmp_path_factory.mktemp("wheel")
    try:
        yield _build_and_install(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # ~350 MB of environment; pytest would keep three runs' worth


def _build_and_install(root: Path) -> Installed:
    source = _clean_source_copy(root / "source")
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", root / "dist", source)
    (wheel,) = (root / "dist").glob("llamba-*.whl")
    venv = root / "venv"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)  # not editable; dependencies too
    workdir = root / "work"
    workdir.mkdir()
    return Installed(wheel, venv, workdir, _server_env(workdir))


@pytest.fixture(scope="module")
def base_url(installed: Installed) -> Iterator[str]:
    """llamba-server from the installed environment on a free port, stopped (and reaped) at the end."""
    port = free_port()
    log_path = installed.workdir / "server.log"
    cmd = [str(installed.venv / "bin" / "llamba-server"), "--port", str(port), "-m", "smollm2"]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=installed.workdir, env=installed.env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"
        _wait_healthy(proc, url, log_path)
        yield url
    finally:
        _stop(proc)


def _wait_healthy(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"llamba-server exited with {proc.returncode}:\n{log_path.read_text()[-4000:]}")
        try:
            if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    pytest.fail(f"llamba-server not healthy after {STARTUP_TIMEOUT_S} s:\n{log_path.read_text()[-4000:]}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _ui_files() -> set[str]:
    return {str(p.relative_to(WEBUI)) for p in WEBUI.rglob("*") if p.is_file()}


def test_the_wheel_holds_the_packages_and_every_ui_file(installed: Installed) -> None:
    names = zipfile.ZipFile(installed.wheel).namelist()
    top = {name.split("/")[0] for name in names}
    dist_info = {t for t in top if t.endswith(".dist-info")}
    assert top - dist_info == PACKAGES  # no tests/, docs/, scripts/
    assert len(dist_info) == 1
    prefix = "server/webui/"
    assert {n.removeprefix(prefix) for n in names if n.startswith(prefix)} == _ui_files()


def test_the_installed_packages_come_from_the_venv_not_the_checkout(installed: Installed) -> None:
    printed = installed.python(
        "import cli, engine, server; print(server.__file__, engine.__file__, cli.__file__)"
    )
    for module_file in map(Path, printed.split()):
        assert module_file.resolve().is_relative_to(installed.venv.resolve()), module_file
        assert not module_file.resolve().is_relative_to(REPO)


def test_the_root_serves_the_ui(base_url: str) -> None:
    reply = httpx.get(base_url + "/")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    assert reply.content == (WEBUI / "index.html").read_bytes()


def test_every_asset_is_served(base_url: str) -> None:
    assets = sorted(name for name in _ui_files() if name.startswith("assets/"))
    assert "assets/js/main.js" in assets
    with httpx.Client(base_url=base_url) as client:
        for name in assets:
            reply = client.get("/" + name)
            assert reply.status_code == 200, name
            assert reply.content == (WEBUI / name).read_bytes(), name  # httpx undoes the gzip


def test_a_chat_completion_answers(base_url: str) -> None:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0}
    reply = httpx.post(base_url + "/v1/chat/completions", json=body, timeout=STARTUP_TIMEOUT_S)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["choices"][0]["message"]["content"].strip()
    assert 1 <= answer["usage"]["completion_tokens"] <= 8
