"""The log: JSON lines stay whole while other threads log (a router parses its children's lines); the
default lines are llama-server's, which its tools (a prompt-cache profiler) read from --log-file."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import httpx

from server.config.parse import parse_settings
from server.http.llama_log import LlamaRenderer
from server.http.logs import LogOutput
from tests.server_process import LIVENESS_S, ServerProcess, wait_until

# The engine thread logs load progress while hypercorn (stdlib logging) announces itself on the same stream.
RACE = """
import logging, sys, threading
import structlog
from server.http import logs
logs.configure("json")
hypercorn = logging.getLogger("hypercorn.error")
def progress():
    for i in range(5000):
        structlog.get_logger().info("model.load_progress", stage="read", value=i)
worker = threading.Thread(target=progress)
worker.start()
for i in range(5000):
    hypercorn.warning("Running on http://127.0.0.1:8080 (CTRL + C to quit) %d", i)
worker.join()
"""


def test_json_lines_stay_whole_while_other_threads_log() -> None:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", RACE], cwd=root, capture_output=True, text=True, check=True)
    lines = out.stderr.splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(events) == 5000 and all("{" not in line for line in lines if not line.startswith("{"))
    assert [e["value"] for e in events] == list(range(5000))


# -- llama-server's lines, as a prompt-cache profiler reads them from --log-file -----------------------
# llama-server's default prefix (time since start, level letter), as kvprof 0.2.0 matches it
PREFIX = r"(\d+)\.(\d\d)\.(\d{3})\.(\d{3}) ([IWE]) "
SLOT = PREFIX + r"slot (?P<fn>[ \w]{12}): id +(?P<slot>\d+) \| task (?P<task>-?\d+) \| "
RATES = r"+[\d.]+ ms / +(?P<n>\d+) tokens \( +[\d.]+ ms per token, +[\d.]+ tokens per second\)$"
PROFILER = {
    "launch": re.compile(SLOT + r"processing task, is_child = 0$"),
    "new_prompt": re.compile(
        SLOT + r"new prompt, n_ctx_slot = \d+, n_keep = \d+, task.n_tokens = (?P<n>\d+)$"
    ),
    "n_past": re.compile(SLOT + r"n_tokens = (?P<n_past>\d+), memory_seq_rm \[(?P<p0>\d+), end\)$"),
    "progress": re.compile(
        SLOT
        + r"prompt processing progress, n_tokens = (?P<n>\d+), batch.n_tokens = \d+, progress = [01]\.\d{6}$"
    ),
    "done": re.compile(SLOT + r"prompt done, n_tokens = (?P<n>\d+), batch.n_tokens = \d+$"),
    "prompt_eval": re.compile(SLOT + r"prompt eval time = " + RATES),
    "eval": re.compile(SLOT + r"       eval time = " + RATES),
    "total": re.compile(SLOT + r"      total time = +[\d.]+ ms / +\d+ tokens$"),
    "release": re.compile(SLOT + r"stop processing: n_tokens = (?P<n>\d+), truncated = 0$"),
}


def _profile(lines: list[str]) -> list[tuple[str, re.Match[str]]]:
    return [(name, m) for line in lines for name, rx in PROFILER.items() if (m := rx.match(line))]


def _chat(base_url: str, messages: list[dict[str, str]]) -> str:
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "stream": True}
    text = []
    with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                text += [c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"]]
    return "".join(text)


def test_log_file_has_llama_servers_slot_lines_for_a_cached_follow_up(tmp_path: Path) -> None:
    log_file = tmp_path / "llama.log"
    server = ServerProcess("-m", "smollm2", "-np", "1", "-c", "1024", "--log-file", str(log_file))
    try:
        server.wait_healthy()
        first = [{"role": "user", "content": "Name a colour."}]
        answer = _chat(server.base_url, first)
        _chat(
            server.base_url,
            [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}],
        )
        wait_until(lambda: log_file.read_text().count("stop processing") == 2, LIVENESS_S, "second release")
    finally:
        server.stop()
    seen = _profile(log_file.read_text().splitlines())
    names = [name for name, _ in seen]
    one = ["launch", "new_prompt", "n_past", "progress", "done", "prompt_eval", "eval", "total", "release"]
    assert names == one + one, names
    assert {m["fn"] for _, m in seen} >= {"launch_slot_", "update_slots", "print_timing", "     release"}
    tasks = [(int(m["slot"]), int(m["task"])) for _, m in seen]
    assert tasks == [(0, 0)] * len(one) + [(0, 1)] * len(one)
    first_past, second_past = (int(m["n_past"]) for name, m in seen if name == "n_past")
    n_prompts = [int(m["n"]) for name, m in seen if name == "new_prompt"]
    evaluated = [int(m["n"]) for name, m in seen if name == "prompt_eval"]
    assert first_past == 0 and evaluated[0] == n_prompts[0]
    # the follow-up reuses the first turn's cells: only its new tokens are evaluated
    assert second_past > n_prompts[0] // 2 and evaluated[1] == n_prompts[1] - second_past
    done = [int(m["n"]) for name, m in seen if name == "done"]
    assert done == n_prompts


def test_log_prefix_timestamps_and_colours() -> None:
    renderer = LlamaRenderer(prefix=True, timestamps=True, colors=True)
    event = {
        "event": "slot.release",
        "level": "info",
        "id_slot": 2,
        "id_task": 7,
        "n_tokens": 9,
        "truncated": 1,
    }
    line = renderer(None, "", event)
    assert re.fullmatch(
        r"\033\[34m\d+\.\d\d\.\d{3}\.\d{3}\033\[0m \033\[32mI \033\[0mslot      release: id  2 \| task 7 \| "
        r"stop processing: n_tokens = 9, truncated = 1",
        line,
    ), line
    warned = LlamaRenderer(prefix=True)(None, "", {"event": "mcp.down", "level": "warning", "server": "a b"})
    assert warned == 'W srv  mcp.down: server="a b"'
    assert LlamaRenderer()(None, "", {"event": "server.ready", "level": "info"}) == "srv  server.ready"


def test_log_flags_parse_as_common_arg_reads_them(tmp_path: Path) -> None:
    settings, _ = parse_settings(
        [
            "-m",
            "x.gguf",
            "-lv",
            "2",
            "--log-file",
            str(tmp_path / "f"),
            "--log-colors",
            "off",
            "--log-prefix",
        ],
        {},
    )
    assert (settings.verbosity, settings.log_colors, settings.log_prefix) == (2, "off", True)
    assert settings.log_file == tmp_path / "f" and settings.log_format == "llama"
    env = {"LLAMA_ARG_LOG_TIMESTAMPS": "1", "LLAMA_ARG_LOG_COLORS": "enabled"}
    settings, _ = parse_settings(["-m", "x.gguf"], env)
    assert settings.log_timestamps and settings.log_colors == "on"
    assert (
        LogOutput(verbosity=2).level() == logging.WARNING
        and LogOutput(disable=True).level() > logging.CRITICAL
    )


def test_log_jsonl_writes_common_logs_json_objects_to_stdout() -> None:
    """--log-jsonl: each line one JSON object (type, time in us since start, level, msg with its
    newline), no colours, on stdout, as common/log.cpp writes it; the slot lines keep their words."""
    proc = ServerProcess("-m", "smollm2", "-np", "1", "-c", "512", "--log-jsonl", "--log-colors", "on")
    try:
        url = proc.wait_healthy().base_url
        httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 2}, timeout=120)
        proc.stop()
        lines = [
            json.loads(line) for line in proc.log_path.read_text().splitlines() if line.startswith('{"type"')
        ]
    finally:
        proc.stop()
    assert lines and all(set(entry) == {"type", "time", "level", "msg"} for entry in lines)
    assert all(entry["type"] == "log" and entry["msg"].endswith("\n") for entry in lines)
    assert all("\033[" not in entry["msg"] for entry in lines)
    release = [e for e in lines if "stop processing: n_tokens" in e["msg"]]
    assert (
        release and release[0]["level"] == "info" and release[0]["msg"].startswith("slot      release: id  0")
    )
    times = [entry["time"] for entry in lines]
    assert times == sorted(times) and times[-1] > 0
    settings, _ = parse_settings(["-m", "x.gguf"], {"LLAMA_ARG_LOG_JSONL": "1"})
    assert settings.log_jsonl
