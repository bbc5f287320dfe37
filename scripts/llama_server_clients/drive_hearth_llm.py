"""hearth-llm 0.1.1 against a server, the way its README runs it.

1. Managed mode, `hearth serve --model <gguf>`: hearth spawns `llama-server` from PATH (here a link to the
   binary under test) with `--slot-save-path <cache> --ctx-size 2048 --parallel 1`. A chat turn through the
   proxy (miss, snapshot saved via /slots/0?action=save), a streamed follow-up (hit: /slots/0?action=restore),
   then hearth and its server are stopped and started again and a third turn must be served from the snapshot
   on disk, with the server reporting a short prefill (timings.prompt_n) after the restore.
2. Attach mode, `hearth serve --upstream URL`: hearth probes a server started here with --slot-save-path and
   --parallel 1 (slot save into its cache dir, /slots length) and proxies a miss and a hit.

usage: python drive_hearth_llm.py --bin BIN --model GGUF --port N --workdir DIR
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, Server, driver_args, http, short, stop_process, wait_port  # noqa: E402

SYSTEM = "You are the archivist of a small mountain library. " * 8 + "Answer briefly."


def chat(proxy, messages, stream=False):
    """-> (status, headers, assistant text, timings)"""
    body = {"model": "m", "messages": messages, "stream": stream, "temperature": 0, "max_tokens": 24}
    req = urllib.request.Request(
        proxy + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        status, headers, raw = r.status, r.headers, r.read().decode()
    if not stream:
        d = json.loads(raw)
        return status, headers, d["choices"][0]["message"]["content"], d.get("timings") or {}
    text, timings = "", {}
    for line in raw.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            ev = json.loads(line[6:])
            if isinstance(ev.get("timings"), dict):
                timings = ev["timings"]
            for ch in ev.get("choices") or []:
                text += (ch.get("delta") or {}).get("content") or ""
    return status, headers, text, timings


class Hearth:
    def __init__(self, exe, args, env, log):
        self.cmd = [exe, "serve", *args]
        self.env, self.log = env, log
        self.proc = None

    def start(self, port):
        with open(self.log, "ab") as out:  # the child keeps its own fd
            self.proc = subprocess.Popen(self.cmd, env=self.env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hearth exited {self.proc.returncode}: {tail(self.log)}")
            if wait_port(f"http://127.0.0.1:{port}/hearth/stats", timeout=1):
                return
            time.sleep(0.3)
        raise TimeoutError(f"hearth not listening: {tail(self.log)}")

    def stop(self):
        if self.proc:
            stop_process(self.proc, signal.SIGINT, timeout=40)


def tail(path, n=400):
    try:
        return open(path, errors="replace").read()[-n:].replace("\n", " | ")
    except OSError:
        return ""


def wait_snapshots(proxy, n, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = http("GET", proxy + "/hearth/stats")[2]
        if isinstance(st, dict) and st.get("snapshots", 0) >= n:
            return st
        time.sleep(0.2)
    return http("GET", proxy + "/hearth/stats")[2]


def main() -> int:
    a = driver_args()
    c = Checks("hearth-llm")
    wd = os.path.abspath(a.workdir)
    exe = os.path.join(os.path.dirname(sys.executable), "hearth")
    shim = os.path.join(wd, "bin")
    os.makedirs(shim, exist_ok=True)
    link = os.path.join(shim, "llama-server")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(a.bin, link)
    env = dict(os.environ, PATH=shim + os.pathsep + os.environ.get("PATH", ""))
    managed(c, exe, a, wd, env)
    attach(c, exe, a, wd, env)
    return c.finish()


def managed(c: Checks, exe, a, wd, env):
    cache = os.path.join(wd, "cache")
    pport, uport = a.port, a.port + 1
    proxy = f"http://127.0.0.1:{pport}"
    args = [
        "--model",
        a.model,
        "--port",
        str(pport),
        "--upstream-port",
        str(uport),
        "--cache-dir",
        cache,
        "--ctx",
        "2048",
    ]
    if a.server_args:
        args += ["--", *a.server_args]
    h = Hearth(exe, args, env, os.path.join(wd, "hearth-managed.log"))
    conv = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which shelf holds the maps?"}]
    state = {}

    if not c.check("managed: hearth serve --model starts llama-server", h.start, pport):
        h.stop()
        return
    try:

        def turn1():
            s, hd, text, tm = chat(proxy, conv)
            assert s == 200 and hd["X-Hearth-Cache"] == "miss", f"{s} X-Hearth-Cache={hd['X-Hearth-Cache']}"
            st = wait_snapshots(proxy, 1)
            assert st.get("snapshots") == 1, (
                f"no snapshot saved (POST /slots/0?action=save): stats {short(st)}; hearth log: {tail(h.log)}"
            )
            state["a1"] = text
            return f"miss, {tm.get('prompt_n')} prompt tokens, snapshot saved ({st['cache_bytes']} bytes)"

        c.check("managed: first turn = miss + snapshot saved", turn1)

        def turn2():
            msgs = conv + [
                {"role": "assistant", "content": state["a1"]},
                {"role": "user", "content": "And the atlases?"},
            ]
            s, hd, text, tm = chat(proxy, msgs, stream=True)
            assert s == 200 and hd["X-Hearth-Cache"] == "hit", (
                f"X-Hearth-Cache={hd['X-Hearth-Cache']}; {tail(h.log)}"
            )
            assert hd["X-Hearth-Restored-Msgs"] == "3" and int(hd["X-Hearth-Restored-Tokens"]) > 0, dict(hd)
            assert text, "empty streamed reply"
            assert tm.get("prompt_n") is not None, "no timings in the stream's last chunk"
            state["a2"] = text
            state["msgs2"] = msgs
            wait_snapshots(proxy, 2)
            return (
                f"hit, restored {hd['X-Hearth-Restored-Msgs']} msgs / "
                f"{hd['X-Hearth-Restored-Tokens']} tokens, "
                f"prompt_n {tm.get('prompt_n')} cache_n {tm.get('cache_n')}"
            )

        c.check("managed: streamed follow-up = hit (slot restore)", turn2)
    finally:
        h.stop()

    def upstream_gone():
        assert not wait_port(f"http://127.0.0.1:{uport}/health", timeout=2), (
            "llama-server still answering after hearth stopped"
        )
        return "hearth stopped its llama-server"

    c.check("managed: stop hearth stops the server", upstream_gone)

    if "msgs2" not in state:
        return
    if not c.check("managed: restart (fresh server process)", h.start, pport):
        h.stop()
        return
    try:

        def turn3():
            msgs = state["msgs2"] + [
                {"role": "assistant", "content": state["a2"]},
                {"role": "user", "content": "Thanks. Who dusts them?"},
            ]
            s, hd, text, tm = chat(proxy, msgs)
            assert hd["X-Hearth-Cache"] == "hit" and hd["X-Hearth-Restored-Msgs"] == "5", (
                f"X-Hearth-Cache={hd['X-Hearth-Cache']} msgs={hd['X-Hearth-Restored-Msgs']}; {tail(h.log)}"
            )
            pn, cn = tm.get("prompt_n"), tm.get("cache_n")
            assert pn is not None and cn, (
                f"restore not used by the server: timings prompt_n={pn} cache_n={cn}"
            )
            assert pn < cn, f"re-prefilled {pn} tokens, reused only {cn}"
            return f"hit from disk: prompt_n {pn}, cache_n {cn}"

        c.check("managed: after restart, turn 3 served from the disk snapshot", turn3)

        def stats():
            st = http("GET", proxy + "/hearth/stats")[2]
            assert st["hits"] == 1 and st["misses"] == 0 and st["tokens_restored"] > 0, short(st)
            return f"hits {st['hits']}, restored {st['tokens_restored']} tokens, {st['snapshots']} snapshots"

        c.check("managed: /hearth/stats", stats)
    finally:
        h.stop()

    def ls():
        p = subprocess.run([exe, "ls", "--cache-dir", cache], capture_output=True, text=True, timeout=60)
        rows = [ln for ln in p.stdout.splitlines()[1:] if ln.strip() and "snapshots" not in ln]
        assert p.returncode == 0 and len(rows) == 3, (
            f"exit {p.returncode}: {p.stdout[-300:]} {p.stderr[-200:]}"
        )
        return f"{len(rows)} snapshots listed"

    c.check("managed: hearth ls", ls)


def attach(c: Checks, exe, a, wd, env):
    cache = os.path.join(wd, "cache-attach")
    os.makedirs(cache, exist_ok=True)
    sport, pport = a.port + 2, a.port + 3
    proxy = f"http://127.0.0.1:{pport}"
    with Server(
        a.bin,
        a.model,
        sport,
        ["--slot-save-path", cache, "--parallel", "1", "-c", "2048", *a.server_args],
        log_path=os.path.join(wd, "server-attach.log"),
    ) as srv:
        h = Hearth(
            exe,
            ["--upstream", srv.url, "--port", str(pport), "--cache-dir", cache],
            env,
            os.path.join(wd, "hearth-attach.log"),
        )
        if not c.check("attach: hearth serve --upstream accepts the server", h.start, pport):
            h.stop()
            return
        try:

            def miss_hit():
                conv = [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": "Where are the ledgers?"},
                ]
                s1, h1, t1, _ = chat(proxy, conv)
                wait_snapshots(proxy, 1)
                s2, h2, _, tm = chat(
                    proxy,
                    conv + [{"role": "assistant", "content": t1}, {"role": "user", "content": "Since when?"}],
                )
                assert (h1["X-Hearth-Cache"], h2["X-Hearth-Cache"]) == ("miss", "hit"), (
                    f"{h1['X-Hearth-Cache']}, {h2['X-Hearth-Cache']}; {tail(h.log)}"
                )
                return f"miss then hit; prompt_n {tm.get('prompt_n')} cache_n {tm.get('cache_n')}"

            c.check("attach: miss then hit", miss_hit)
        finally:
            h.stop()


if __name__ == "__main__":
    sys.exit(main())
