"""kvprof 0.2.0 against a server, the way its README sets it up.

Starts `<bin> -m <model> -c 4096 --log-file server.log` (README: "write its log to a file, e.g.
llama-server ... --log-file server.log"), runs `kvprof tap` in front of it, and sends through the tap,
streamed: an OpenAI chat (a cold first turn, a follow-up that extends it, then the same conversation with an
edited system prompt) and an Anthropic /v1/messages chat (cold turn + follow-up). Then runs
`kvprof doctor --server-log` and `kvprof analyze --server-log --json` and checks the report: every prompt's
rendering matches the server's count ("exact"), the follow-ups are seen as extensions that reused the cache
(usage and server log), the rewrite is found in the system section, and every request is paired with its
task in the server log.

usage: python drive_kvprof.py --bin BIN --model GGUF --port N --workdir DIR
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, Server, driver_args, short, stop_process  # noqa: E402

SYSTEM = "You are a careful assistant for the harbour master's office. " * 6 + "Answer in one short sentence."
SYSTEM_EDITED = SYSTEM.replace("one short sentence", "two short sentences")
SYSTEM_B = "You keep the lighthouse inventory: lamps, wicks, oil and spare lenses. " * 6 + "Reply briefly."
# kvprof calls any request without tools a "side" request (titles, summaries), so the chats carry a tool.
TOOL_PARAMS = {
    "type": "object",
    "properties": {"pier": {"type": "string", "description": "Pier name"}},
    "required": ["pier"],
}
TOOLS_OPENAI = [
    {
        "type": "function",
        "function": {
            "name": "timetable",
            "description": "Ferry timetable of a pier.",
            "parameters": TOOL_PARAMS,
        },
    }
]
TOOLS_ANTHROPIC = [
    {"name": "timetable", "description": "Ferry timetable of a pier.", "input_schema": TOOL_PARAMS}
]


def sse_post(url, body, headers=None):
    """POST, read the SSE stream to the end -> (status, list of decoded data events)."""
    req = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    events = []
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode("utf-8", "replace").strip()
            if line.startswith("data:"):
                data = line[5:].strip()
                if data and data != "[DONE]":
                    events.append(json.loads(data))
        return r.status, events


def openai_turn(base, messages):
    status, events = sse_post(
        base + "/v1/chat/completions",
        {
            "model": "smollm2",
            "messages": messages,
            "tools": TOOLS_OPENAI,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "max_tokens": 24,
        },
    )
    text = "".join(
        (e.get("choices") or [{}])[0].get("delta", {}).get("content") or ""
        for e in events
        if e.get("choices")
    )
    return status, text


def anthropic_turn(base, messages):
    status, events = sse_post(
        base + "/v1/messages",
        {
            "model": "smollm2",
            "system": SYSTEM_B,
            "messages": messages,
            "tools": TOOLS_ANTHROPIC,
            "stream": True,
            "max_tokens": 24,
            "temperature": 0,
        },
        headers={"anthropic-version": "2023-06-01", "x-api-key": "local"},
    )
    text = "".join(
        e.get("delta", {}).get("text", "") for e in events if e.get("type") == "content_block_delta"
    )
    return status, text


def main() -> int:
    a = driver_args()
    c = Checks("kvprof")
    wd = os.path.abspath(a.workdir)
    log = os.path.join(wd, "server.log")
    traces = os.path.join(wd, "traces")
    tap_port = a.port + 1
    kv = os.path.join(os.path.dirname(sys.executable), "kvprof")
    env = dict(os.environ, KVPROF_DATA_DIR=os.path.join(wd, "data"))
    with Server(
        a.bin,
        a.model,
        a.port,
        ["-c", "4096", "--log-file", log, *a.server_args],
        log_path=os.path.join(wd, "server.out"),
    ) as srv:
        with open(os.path.join(wd, "tap.log"), "wb") as tap_log:  # the child keeps its own fd
            tap = subprocess.Popen(
                [
                    kv,
                    "tap",
                    "--upstream",
                    srv.url,
                    "--listen",
                    f"127.0.0.1:{tap_port}",
                    "--trace-dir",
                    traces,
                    "--quiet",
                ],
                cwd=wd,
                env=env,
                stdout=tap_log,
                stderr=subprocess.STDOUT,
            )
        try:
            time.sleep(1.0)
            drive(c, f"http://127.0.0.1:{tap_port}", traces)
        finally:
            stop_process(tap)
        time.sleep(0.5)  # the server's log file gets its last lines
        doctor(c, kv, srv.url, log, env, wd)
        analyze(c, kv, srv.url, log, traces, env, wd)
    return c.finish()


def drive(c: Checks, tap, traces):
    def conversation():
        msgs = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Where do the ferries dock?"},
        ]
        s1, t1 = openai_turn(tap, msgs)
        msgs2 = msgs + [
            {"role": "assistant", "content": t1},
            {"role": "user", "content": "And at what time?"},
        ]
        s2, t2 = openai_turn(tap, msgs2)
        msgs3 = [{"role": "system", "content": SYSTEM_EDITED}] + msgs2[1:]
        s3, _ = openai_turn(tap, msgs3)
        am = [{"role": "user", "content": "How many spare lenses are left?"}]
        s4, a1 = anthropic_turn(tap, am)
        s5, _ = anthropic_turn(
            tap, am + [{"role": "assistant", "content": a1}, {"role": "user", "content": "And how much oil?"}]
        )
        assert [s1, s2, s3, s4, s5] == [200] * 5, f"statuses {[s1, s2, s3, s4, s5]}"
        assert t1 and t2 and a1, f"empty streamed text: {[t1, t2, a1]}"
        return f"answers {t1[:30]!r} / {t2[:30]!r}; anthropic {a1[:30]!r}"

    c.check("5 streamed chats through the tap (3 OpenAI, 2 Anthropic)", conversation)

    def recorded():
        deadline = time.time() + 20
        while time.time() < deadline:
            names = (
                [
                    n
                    for n in os.listdir(traces)
                    if n.endswith(".json") and not n.startswith(".") and not n.endswith(".analysis.json")
                ]
                if os.path.isdir(traces)
                else []
            )
            outs = []
            for n in sorted(names):
                with open(os.path.join(traces, n)) as f:
                    outs.append(json.load(f).get("outcome"))
            if len(outs) >= 5 and all(o != "inflight" for o in outs):
                assert all(o == "ok" for o in outs), f"outcomes {outs}"
                return f"{len(outs)} traces, outcomes ok"
            time.sleep(0.2)
        raise AssertionError(f"traces not complete: {names} {outs}")

    c.check("tap recorded 5 complete traces", recorded)


def doctor(c: Checks, kv, url, log, env, wd):
    def run():
        p = subprocess.run(
            [kv, "doctor", "--upstream", url, "--server-log", log],
            capture_output=True,
            text=True,
            timeout=300,
            env=env,
            cwd=wd,
        )
        out = p.stdout + p.stderr
        with open(os.path.join(wd, "doctor.txt"), "w") as f:
            f.write(out)
        fails = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("FAIL")]
        assert p.returncode == 0 and not fails, f"exit {p.returncode}: {' | '.join(fails) or out[-300:]}"
        warns = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("WARN")]
        return "no FAIL" + (
            f"; {len(warns)} WARN: " + " | ".join(w[5:].strip()[:90] for w in warns) if warns else ""
        )

    c.check("kvprof doctor --server-log", run)


def analyze(c: Checks, kv, url, log, traces, env, wd):
    p = subprocess.run(
        [kv, "analyze", "--upstream", url, "--trace-dir", traces, "--server-log", log, "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=wd,
    )
    with open(os.path.join(wd, "analyze.json"), "w") as f:
        f.write(p.stdout)
    with open(os.path.join(wd, "analyze.stderr"), "w") as f:
        f.write(p.stderr)
    txt = subprocess.run(
        [kv, "analyze", "--upstream", url, "--trace-dir", traces, "--server-log", log],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        cwd=wd,
    )
    with open(os.path.join(wd, "analyze.txt"), "w") as f:
        f.write(txt.stdout + txt.stderr)
    print(txt.stdout, flush=True)
    try:
        rows = json.loads(p.stdout)
    except ValueError:
        c.add("kvprof analyze --json", False, f"exit {p.returncode}: {(p.stderr or p.stdout)[-300:]}")
        return
    c.add(
        "kvprof analyze --json",
        len(rows) == 5,
        f"{len(rows)} requests analyzed"
        + (f"; stderr {p.stderr.strip()[-200:]!r}" if p.stderr.strip() else ""),
    )
    if len(rows) != 5:
        return
    o1, o2, o3, a1, a2 = rows

    def exact():
        bad = [
            (r["seq"], r["api"], r["prompt_tokens"], r["input_tokens"])
            for r in rows
            if r["exact"] is not True
        ]
        assert not bad, f"rendered vs server prompt tokens differ (seq, api, rendered, usage): {bad}"
        return "rendered prompt == server's prompt token count for all 5"

    c.check("exact: /apply-template + /tokenize match the server's usage", exact)

    def kinds():
        got = [r["kind"] for r in rows]
        want = ["cold", "main_turn", "rewrite", "cold", "main_turn"]
        assert got == want, f"kinds {got}, expected {want}"
        assert o3["diverge_section"] and o3["diverge_section"].startswith("system"), (
            f"rewrite diverged in {o3['diverge_section']!r}"
        )
        return f"{got}; rewrite found in {o3['diverge_section']}"

    c.check("classified cold / main_turn / rewrite", kinds)

    def reuse_usage():
        for r in (o2, a2):
            assert r["cache_read"] and r["cache_read"] > 0, (
                f"#{r['seq']} ({r['api']}): no cached tokens in usage (cache_read={r['cache_read']})"
            )
            assert r["reused"] and r["prefilled"] is not None and r["prefilled"] < r["prompt_tokens"], (
                f"#{r['seq']}: prefilled {r['prefilled']} of {r['prompt_tokens']}, reused {r['reused']}"
            )
        return (
            f"openai follow-up: {o2['reused']} reused / {o2['prefilled']} prefilled "
            f"of {o2['prompt_tokens']}; "
            f"anthropic: {a2['reused']} / {a2['prefilled']} of {a2['prompt_tokens']}"
        )

    c.check("cache reuse on the follow-ups (usage)", reuse_usage)

    def log_pairing():
        unpaired = [
            (r["seq"], r["log_match"])
            for r in rows
            if r["log_match"] in (None, "none") or r["task_id"] is None
        ]
        assert not unpaired, f"requests not paired with a server-log task (seq, log_match): {unpaired}"
        return ", ".join(f"#{r['seq']}->task {r['task_id']} ({r['log_match']})" for r in rows)

    c.check("requests paired with server-log tasks", log_pairing)

    def log_reuse():
        for r in (o2, a2):
            assert r["select"] == "LCP" and r["f_keep"], (
                f"#{r['seq']}: slot selection {r['select']} f_keep {r['f_keep']}"
            )
            assert r["pp_s"] is not None and r["prefilled"] < r["prompt_tokens"], (
                f"#{r['seq']}: log prefill {r['prefilled']} of {r['prompt_tokens']}"
            )
        return (
            f"follow-ups: LCP f_keep {o2['f_keep']}, {a2['f_keep']}; "
            f"prefilled {o2['prefilled']}, {a2['prefilled']}"
        )

    c.check("server log shows the reuse (LCP slot, short prefill)", log_reuse)

    for r in rows:
        print("  " + short(r["summary"], 400), flush=True)


if __name__ == "__main__":
    sys.exit(main())
