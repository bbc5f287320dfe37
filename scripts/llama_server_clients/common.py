"""Shared pieces of the client drivers: start a server binary that takes llama-server's command line, wait for
it, stop it, and record named checks.

Every driver prints one line per check ("ok   name: detail" / "FAIL name: detail") and, last, one line
"RESULT: PASS n/n" or "RESULT: FAIL k/n passed; failed: a, b"; run.sh shows that last line.
Standard library only, so the drivers import it from any virtual environment.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
import urllib.error
import urllib.request


def http(method: str, url: str, body=None, timeout: float = 120.0, headers: dict | None = None):
    """-> (status, headers, parsed JSON or text). Never raises on an HTTP status."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, dict(e.headers), e.read()
    text = raw.decode("utf-8", "replace")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


class Server:
    """`binary -m model --host 127.0.0.1 --port N <extra>` as a context manager; waits for /health == 200."""

    def __init__(
        self,
        binary: str,
        model: str,
        port: int,
        extra=(),
        log_path: str | None = None,
        start_timeout: float = 300.0,
    ):
        self.args = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), *extra]
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None

    def __enter__(self):
        out = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(
                self.args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if self.log_path:
                out.close()
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"server exited with code {self.proc.returncode} at start: {' '.join(self.args)}"
                    + (f" (see {self.log_path})" if self.log_path else "")
                )
            try:
                if http("GET", self.url + "/health", timeout=2)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"server not healthy after {self.start_timeout:.0f}s: {' '.join(self.args)}")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __exit__(self, *exc):
        self.stop()


def stop_process(proc: subprocess.Popen, sig=signal.SIGTERM, timeout: float = 30.0):
    """Stop one process this driver started (by its own handle), escalating to SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def wait_port(url: str, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return True
        except urllib.error.HTTPError:
            return True  # it answered
        except OSError:
            time.sleep(0.2)
    return False


class Checks:
    """Named checks; `check(name, fn)` runs fn, which returns a detail string (pass) or raises (fail)."""

    def __init__(self, client: str):
        self.client = client
        self.results: list[tuple[str, bool, str]] = []

    def add(self, name: str, ok: bool, detail: str = ""):
        self.results.append((name, ok, detail))
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)

    def check(self, name: str, fn, *args, **kwargs):
        try:
            detail = fn(*args, **kwargs)
            self.add(name, True, "" if detail is None else str(detail))
            return True
        except AssertionError as e:
            self.add(name, False, str(e) or "assertion failed")
        except Exception as e:  # noqa: BLE001 - a client's exception is a result here
            self.add(name, False, f"{type(e).__name__}: {e}")
            if os.environ.get("LLSC_TRACEBACK"):
                traceback.print_exc()
        return False

    def finish(self) -> int:
        n = len(self.results)
        passed = sum(1 for _, ok, _ in self.results if ok)
        failed = [name for name, ok, _ in self.results if not ok]
        if failed:
            print(f"RESULT: FAIL {passed}/{n} passed; failed: {', '.join(failed)}", flush=True)
            return 1
        print(f"RESULT: PASS {passed}/{n}", flush=True)
        return 0


def short(obj, n: int = 300) -> str:
    s = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    return s if len(s) <= n else s[:n] + "..."


def driver_args(argv=None):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="server binary taking llama-server's command line")
    ap.add_argument("--model", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--workdir", required=True, help="scratch folder for logs, traces, slot files")
    ap.add_argument(
        "--server-arg",
        action="append",
        default=[],
        dest="server_args",
        help="one more argument for the server command line (repeatable), e.g. --server-arg=--log-prefix",
    )
    a = ap.parse_args(argv)
    os.makedirs(a.workdir, exist_ok=True)
    return a


def die(msg: str) -> None:
    print(f"RESULT: FAIL 0/1 passed; failed: {msg}", flush=True)
    sys.exit(1)


def warm_up(argv=None) -> int:
    """`python common.py --bin B --model M --port N --workdir D`: start the server once and stop it, so that
    the runs after it do not pay first-start costs (a JIT cache filled after a code change) inside a client's
    own start deadline (stillwarm's tests allow 30 s). Prints how long the start took."""
    a = driver_args(argv)
    t0 = time.monotonic()
    try:
        with Server(a.bin, a.model, a.port, ["-c", "2048"], log_path=os.path.join(a.workdir, "warmup.log")):
            pass
    except Exception as e:  # noqa: BLE001
        print(f"warm-up start failed: {e}")
        return 1
    print(f"warm-up start: {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(warm_up())
