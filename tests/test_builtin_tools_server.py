"""The built-in tools (`--tools all`) and /cors-proxy (`--ui-mcp-proxy`) end to end: one real server with
SmolLM2 and an API key, real httpx clients, tmp_path working directories (x-tool-cwd), a real local
HTTP server behind the proxy. Each tool's success, each refusal, streaming, no process left behind."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_process import LIVENESS_S, ServerProcess, wait_until

KEY = "tools-key"


@pytest.fixture(scope="module")
def srv() -> Iterator[ServerProcess]:
    # The key by its variable, as a router hands its children theirs: commands must not see it.
    args = ("-m", "smollm2", "-c", "2048", "--tools", "all", "--ui-mcp-proxy", "--tools-regex-timeout", "1")
    proc = ServerProcess(*args, env={"LLAMA_ARG_API_KEY": KEY})
    yield proc.wait_healthy()
    proc.stop()


@pytest.fixture
def client(srv: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=srv.base_url, headers={"X-Api-Key": KEY}, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def files_only() -> Iterator[httpx.Client]:
    """A server with the file and search tools but not the shell, nor --ui-mcp-proxy: its file tools are
    confined to the working directory (server/builtin_tools/workdir.py)."""
    tools = "read_file,file_glob_search,grep_search,write_file,edit_file"
    proc = ServerProcess("-m", "smollm2", "-c", "512", "--tools", tools).wait_healthy()
    with httpx.Client(base_url=proc.base_url, timeout=120) as c:
        yield c
    proc.stop()


def call(client: httpx.Client, cwd: Path, tool: str, **params: Any) -> httpx.Response:
    return client.post("/tools", json={"tool": tool, "params": params}, headers={"x-tool-cwd": str(cwd)})


def ok(client: httpx.Client, cwd: Path, tool: str, **params: Any) -> dict[str, Any]:
    reply = call(client, cwd, tool, **params)
    assert reply.status_code == 200, reply.text
    assert "error" not in reply.json(), reply.json()
    return reply.json()


def failed(client: httpx.Client, cwd: Path, tool: str, **params: Any) -> str:
    """A tool's own failure: 200 with {"error": ...}, as llama-server answers."""
    reply = call(client, cwd, tool, **params)
    assert reply.status_code == 200 and set(reply.json()) == {"error"}, reply.text
    return reply.json()["error"]


def processes_with(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (zombies, already dead, are not counted)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(pid))
    return found


# -- listing, and what /tools requires ---------------------------------------------------------------
def test_get_tools_lists_the_builtin_tools_in_llama_servers_shape(client: httpx.Client) -> None:
    tools = client.get("/tools").json()
    names = ["read_file", "file_glob_search", "grep_search", "exec_shell_command", "write_file", "edit_file"]
    assert [t["tool"] for t in tools] == names
    for tool in tools:
        assert tool["type"] == "server" and tool["uses_cwd"] is True and tool["display_name"]
        assert tool["permissions"] == {
            "write": tool["tool"] in ("exec_shell_command", "write_file", "edit_file")
        }
        function = tool["definition"]["function"]
        assert tool["definition"]["type"] == "function" and function["name"] == tool["tool"]
        assert function["parameters"]["type"] == "object" and "$defs" not in json.dumps(function)


def test_the_api_key_guards_tools_and_the_proxy(srv: ServerProcess) -> None:
    for path in ("/tools", "/cors-proxy?url=http://127.0.0.1:1/"):
        assert httpx.get(srv.base_url + path).status_code == 401
        assert httpx.get(srv.base_url + path, headers={"X-Api-Key": "wrong"}).status_code == 401
    assert httpx.post(srv.base_url + "/tools", json={"tool": "read_file"}).status_code == 401
    assert httpx.get(srv.base_url + "/tools", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_cors_allows_only_localhost_pages(client: httpx.Client, tmp_path: Path) -> None:
    # llama-server's default with tools (--cors-origins localhost); a refused page's preflight is answered
    # 200 without the Access-Control-Allow-* headers, its request itself is refused.
    refused = client.options(
        "/tools", headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
    )
    assert refused.status_code == 200 and not [h for h in refused.headers if h.startswith("access-control")]
    body = {"tool": "file_glob_search", "params": {"path": "."}, "cwd": str(tmp_path)}
    evil = client.post("/tools", json=body, headers={"Origin": "http://evil.example"})
    assert evil.status_code == 403 and "access-control-allow-origin" not in evil.headers
    local = client.post("/tools", json=body, headers={"Origin": "http://localhost:5173"})
    assert (
        local.status_code == 200 and local.headers["access-control-allow-origin"] == "http://localhost:5173"
    )
    preflight = client.options(  # answered before the key is checked, as a browser sends it without one
        "/tools",
        headers={"Origin": "http://[::1]:3000", "Access-Control-Request-Method": "POST", "X-Api-Key": ""},
    )
    assert preflight.headers["access-control-allow-origin"] == "http://[::1]:3000"
    # On the wire in llama-server's case (server/http/header_case.py), as clients that copy headers into a
    # plain dict look them up.
    names = {name for name, _ in preflight.headers.raw}
    assert {b"Access-Control-Allow-Origin", b"Access-Control-Allow-Credentials", b"Content-Type"} <= names
    own = names - {b"date", b"server"}  # hypercorn adds these two itself, after the app's layers
    assert own and all(name == name.title() for name in own), own
    assert {name: value for name, value in preflight.headers.raw}[b"Access-Control-Allow-Headers"] == b"*"


# -- files ---------------------------------------------------------------------------------------------
def test_write_read_and_edit_a_file(client: httpx.Client, tmp_path: Path) -> None:
    written = ok(client, tmp_path, "write_file", path="src/a.txt", content="one\ntwo\nthree\n")
    assert written == {"result": "file written successfully", "path": "src/a.txt", "bytes": 14}
    assert (tmp_path / "src/a.txt").read_text() == "one\ntwo\nthree\n"
    assert ok(client, tmp_path, "read_file", path="src/a.txt") == {"plain_text_response": "one\ntwo\nthree\n"}
    part = ok(client, tmp_path, "read_file", path="src/a.txt", start_line=2, end_line=3, append_loc=True)
    assert part["plain_text_response"] == "2→two\n3→three\n"
    edits = [{"old_text": "one", "new_text": "1"}, {"old_text": "three", "new_text": "3"}]
    edited = ok(
        client, tmp_path, "edit_file", path=str(tmp_path / "src/a.txt"), edits=edits
    )  # absolute, inside
    assert edited["edits_applied"] == 2 and (tmp_path / "src/a.txt").read_text() == "1\ntwo\n3\n"


def test_the_body_cwd_is_used_without_the_header(client: httpx.Client, tmp_path: Path) -> None:
    (tmp_path / "here.txt").write_text("here\n")
    body = {"tool": "read_file", "params": {"path": "here.txt", "cwd": "/"}, "cwd": str(tmp_path)}
    assert client.post("/tools", json=body).json() == {"plain_text_response": "here\n"}  # params' cwd unused


def test_edit_refusals(client: httpx.Client, tmp_path: Path) -> None:
    (tmp_path / "f.txt").write_text("abcdef abc")
    assert "must be unique" in failed(
        client, tmp_path, "edit_file", path="f.txt", edits=[{"old_text": "abc", "new_text": "x"}]
    )
    overlapping = [{"old_text": "abcd", "new_text": "x"}, {"old_text": "cdef", "new_text": "y"}]
    assert "overlap" in failed(client, tmp_path, "edit_file", path="f.txt", edits=overlapping)
    missing = [{"old_text": "zzz", "new_text": "y"}]
    assert "could not find edits[0].old_text" in failed(
        client, tmp_path, "edit_file", path="f.txt", edits=missing
    )
    assert "non-empty" in failed(client, tmp_path, "edit_file", path="f.txt", edits=[])
    same = [{"old_text": "def", "new_text": "def"}]
    assert "no changes made" in failed(client, tmp_path, "edit_file", path="f.txt", edits=same)
    assert (tmp_path / "f.txt").read_text() == "abcdef abc"  # nothing was applied


def test_read_refusals(client: httpx.Client, tmp_path: Path) -> None:
    assert failed(client, tmp_path, "read_file", path="nope.txt") == "cannot stat file: nope.txt"
    (tmp_path / "big.txt").write_text("x" * 20000 + "\n")
    assert "file too large" in failed(client, tmp_path, "read_file", path="big.txt")
    cut = ok(client, tmp_path, "read_file", path="big.txt", end_line=5)["plain_text_response"]
    assert cut == "[output truncated]"


def test_with_the_shell_tool_paths_reach_outside_the_working_directory(
    client: httpx.Client, tmp_path: Path
) -> None:
    # llama-server's behaviour: relative paths against x-tool-cwd, absolute ones anywhere (the shell
    # reaches every path anyway, so confining the file tools would protect nothing).
    wd, other = tmp_path / "wd", tmp_path / "other"
    wd.mkdir()
    other.mkdir()
    (other / "abs.txt").write_text("absolute-content\n")
    assert (
        ok(client, wd, "read_file", path=str(other / "abs.txt"))["plain_text_response"]
        == "absolute-content\n"
    )
    assert ok(client, wd, "read_file", path="../other/abs.txt")["plain_text_response"] == "absolute-content\n"
    ok(client, wd, "write_file", path=str(other / "new.txt"), content="written")
    assert (other / "new.txt").read_text() == "written"
    edited = ok(
        client, wd, "edit_file", path=str(other / "new.txt"), edits=[{"old_text": "wr", "new_text": "rewr"}]
    )
    assert edited["edits_applied"] == 1 and (other / "new.txt").read_text() == "rewritten"
    listed = ok(client, wd, "file_glob_search", path=str(other))
    assert [e["path"] for e in listed["entries"]] == ["abs.txt", "new.txt"] and listed["base"] == str(
        other.resolve()
    )
    assert (
        "Total matches: 1"
        in ok(client, wd, "grep_search", path=str(other), pattern="absolute")["plain_text_response"]
    )


def test_without_the_shell_tool_paths_outside_the_working_directory_are_refused(
    files_only: httpx.Client, tmp_path: Path
) -> None:
    client = files_only
    wd = tmp_path / "wd"
    wd.mkdir()
    (tmp_path / "secret.txt").write_text("secret")
    (wd / "out").symlink_to(tmp_path)
    for path in ("../secret.txt", str(tmp_path / "secret.txt"), "out/secret.txt", "/etc/passwd"):
        assert "outside the working directory" in failed(client, wd, "read_file", path=path)
        assert "outside the working directory" in failed(client, wd, "grep_search", path=path, pattern="s")
    assert "outside" in failed(client, wd, "write_file", path="../new.txt", content="x")
    assert "outside" in failed(client, wd, "write_file", path="out/new.txt", content="x")
    assert not (tmp_path / "new.txt").exists()
    assert "outside" in failed(client, wd, "file_glob_search", path="..")
    (wd / "leak.txt").symlink_to(tmp_path / "secret.txt")  # a link to a file outside: not read by a search
    grep = ok(client, wd, "grep_search", path=".", pattern="secret")["plain_text_response"]
    assert "Total matches: 0" in grep


# -- search ----------------------------------------------------------------------------------------
def test_file_glob_search(client: httpx.Client, tmp_path: Path) -> None:
    for rel in ("a.py", "pkg/b.py", "pkg/deep/c.py", "pkg/notes.md", "node_modules/x.py", ".venv/y.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("print(1)\n")
    found = ok(client, tmp_path, "file_glob_search", path=".", include="*.py")
    assert [e["path"] for e in found["entries"]] == ["a.py", "pkg/b.py", "pkg/deep/c.py"]  # junk skipped
    assert found["base"] == str(tmp_path.resolve()) and "Total matches: 3" in found["plain_text_response"]
    junk = ok(client, tmp_path, "file_glob_search", path=".", type="dir")  # junk folders: listed, not entered
    assert [e["path"] for e in junk["entries"]] == [".venv", "node_modules", "pkg", "pkg/deep"]
    shallow = ok(client, tmp_path, "file_glob_search", path=".", include="*.py", max_depth=1)
    assert [e["path"] for e in shallow["entries"]] == ["a.py"]
    dirs = ok(client, tmp_path, "file_glob_search", path="pkg", type="dir")
    assert dirs["entries"] == [{"path": "deep", "type": "dir"}]
    excluded = ok(client, tmp_path, "file_glob_search", path=".", include="*.py", exclude="pkg/**")
    assert [e["path"] for e in excluded["entries"]] == ["a.py"]
    limited = ok(client, tmp_path, "file_glob_search", path=".", limit=1)["plain_text_response"]
    assert "[1 results limit reached (4 total matches)" in limited
    assert "not a directory" in failed(client, tmp_path, "file_glob_search", path="a.py")


def test_grep_search(client: httpx.Client, tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("import os\nx = 1\ny = 2 + x\n")
    (tmp_path / "n.txt").write_text("X marks\n")
    plain = ok(client, tmp_path, "grep_search", path=".", pattern=r"\bx\b", include="*.py")
    assert plain["plain_text_response"] == "m.py:x = 1\nm.py:y = 2 + x\n\n---\nTotal matches: 2\n"
    context = ok(client, tmp_path, "grep_search", path="m.py", pattern="x = 1", context_lines=1)
    assert context["plain_text_response"].startswith("m.py-1-import os\nm.py:2:x = 1\nm.py-3-y = 2 + x\n--\n")
    folded = ok(client, tmp_path, "grep_search", path=".", pattern="x marks", ignore_case=True)
    assert "n.txt:X marks" in folded["plain_text_response"]
    literal = ok(client, tmp_path, "grep_search", path=".", pattern="2 + x", literal=True)
    assert "Total matches: 1" in literal["plain_text_response"]
    assert failed(client, tmp_path, "grep_search", path=".", pattern="(").startswith("invalid regex")
    assert "does not exist" in failed(client, tmp_path, "grep_search", path="nope", pattern="x")


def test_search_skips_git_ignored_files(client: httpx.Client, tmp_path: Path) -> None:
    files = {".gitignore": "*.log\nbuild/\n", "a.py": "needle\n", "debug.log": "needle\n",
             "build/gen.py": "needle\n", "sub/b.py": "needle\n"}  # fmt: skip
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)  # a work tree: git lists the files
    grep = ok(client, tmp_path, "grep_search", path=".", pattern="needle")["plain_text_response"]
    assert grep == "a.py:needle\nsub/b.py:needle\n\n---\nTotal matches: 2\n"
    listed = ok(client, tmp_path, "file_glob_search", path=".", type="all")["entries"]
    assert [e["path"] for e in listed] == ["sub", ".gitignore", "a.py", "sub/b.py"]
    shutil.rmtree(tmp_path / ".git")  # no work tree now: .gitignore's rules, read by pathspec
    again = ok(client, tmp_path, "file_glob_search", path=".", type="all")["entries"]
    assert [e["path"] for e in again] == ["sub", ".gitignore", "a.py", "sub/b.py"]


def spinning_threads(pid: int, samples: int = 20) -> set[str]:
    """The server's threads that are running (or runnable) at every sample over ~1 s: a thread stuck in
    a pattern would be one; idle threads sleep."""
    always: set[str] | None = None
    for _ in range(samples):
        running = set()
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] == "R":
                    running.add(task.name)
        always = running if always is None else always & running
        time.sleep(0.05)
    return always or set()


def test_a_catastrophic_pattern_is_a_tool_error_and_the_server_keeps_serving(
    srv: ServerProcess, client: httpx.Client, tmp_path: Path
) -> None:
    (tmp_path / "long.txt").write_text("a" * 20000 + "!\n")
    error = failed(client, tmp_path, "grep_search", path=".", pattern="(a+)+$")
    assert "took longer than 1 s (--tools-regex-timeout)" in error
    assert not spinning_threads(srv.proc.pid)  # its worker thread is free, not spinning on
    found = ok(client, tmp_path, "grep_search", path=".", pattern="a!$")["plain_text_response"]
    assert found.endswith("Total matches: 1\n")
    assert client.get("/health").status_code == 200


# -- the shell -------------------------------------------------------------------------------------
def test_exec_runs_in_the_working_directory(client: httpx.Client, tmp_path: Path) -> None:
    out = ok(client, tmp_path, "exec_shell_command", command="pwd; echo oops >&2; exit 3")[
        "plain_text_response"
    ]
    assert out == f"{tmp_path.resolve()}\noops\n\n[exit code: 3]"
    big = ok(client, tmp_path, "exec_shell_command", command="head -c 100000 /dev/zero | tr '\\0' a")
    assert big["plain_text_response"].endswith("\n[output truncated]\n[exit code: 0]")
    env = ok(client, tmp_path, "exec_shell_command", command="env")["plain_text_response"]
    assert "PATH=" in env and "LLAMA_ARG_API_KEY" not in env and KEY not in env


def test_exec_timeout_kills_the_whole_process_group(client: httpx.Client, tmp_path: Path) -> None:
    marker = "1234.567"
    command = f"echo before; sleep {marker} & sleep {marker}"
    out = ok(client, tmp_path, "exec_shell_command", command=command, timeout=1)["plain_text_response"]
    assert out.startswith("before\n") and out.endswith("[exit due to timed out]")
    gone = lambda: not processes_with(f"sleep {marker}")  # noqa: E731
    wait_until(gone, LIVENESS_S, "the timed-out command's processes gone")


def test_exec_streams_its_output_as_it_comes(client: httpx.Client, tmp_path: Path) -> None:
    body = {"tool": "exec_shell_command", "stream": True, "cwd": str(tmp_path),
            "params": {"command": "for i in 1 2 3; do echo $i; sleep 0.3; done"}}  # fmt: skip
    with client.stream("POST", "/tools", json=body) as reply:
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in reply.iter_lines() if line.startswith("data: ")]
    chunks = [e["chunk"] for e in events[:-1]]
    assert (
        len(chunks) >= 4 and "".join(chunks) == "1\n2\n3\n\n[exit code: 0]"
    )  # one event per line, then the code
    assert events[-1] == {"done": True}


def test_a_client_gone_mid_stream_kills_the_command(client: httpx.Client, tmp_path: Path) -> None:
    marker = "2345.678"
    body = {"tool": "exec_shell_command", "stream": True, "cwd": str(tmp_path),
            "params": {"command": f"echo started; sleep {marker}", "timeout": 60}}  # fmt: skip
    with client.stream("POST", "/tools", json=body) as reply:
        lines = reply.iter_lines()  # held: a dropped iterator would close the stream, ending the run early
        assert next(lines) == 'data: {"chunk":"started\\n"}'
        wait_until(lambda: bool(processes_with(f"sleep {marker}")), LIVENESS_S, "the command running")
    gone = lambda: not processes_with(f"sleep {marker}")  # noqa: E731
    wait_until(gone, LIVENESS_S, "the abandoned command's processes gone")


# -- bad requests ----------------------------------------------------------------------------------
def test_bad_requests_are_4xx_naming_the_field(client: httpx.Client, tmp_path: Path) -> None:
    def error(reply: httpx.Response, status: int) -> str:
        assert reply.status_code == status, reply.text
        assert set(reply.json()["error"]) >= {"code", "message", "type"}
        return reply.json()["error"]["message"]

    assert "'path'" in error(call(client, tmp_path, "read_file"), 400)
    assert "'path'" in error(call(client, tmp_path, "read_file", path=3), 400)
    assert "'edits" in error(call(client, tmp_path, "edit_file", path="f", edits="x"), 400)
    # file_glob_search's type and limit are the tool's to check: a 200 error the model reads, as
    # llama-server answers them.
    assert failed(client, tmp_path, "file_glob_search", path=".", type="pipe").startswith(
        "invalid type: pipe"
    )
    assert failed(client, tmp_path, "file_glob_search", path=".", limit=0).startswith("invalid limit: 0")
    assert "'stream'" in error(
        client.post("/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True}), 400
    )
    assert "nope" in error(call(client, tmp_path, "nope"), 404)
    for cwd in ("relative", str(tmp_path / "missing")):
        reply = client.post(
            "/tools", json={"tool": "read_file", "params": {"path": "x"}}, headers={"x-tool-cwd": cwd}
        )
        assert "working directory" in error(reply, 400)
    for runtime, why in (
        ("docker-container:--privileged", "invalid container id"),
        ("ssh:-oProxyCommand=sh", "invalid ssh target"),
        ("docker:ubuntu", "unknown tool runtime"),
    ):
        reply = client.post(
            "/tools",
            json={"tool": "exec_shell_command", "params": {"command": "id"}},
            headers={"x-tool-runtime": runtime},
        )
        assert why in error(reply, 400)


def test_file_tools_refuse_a_runtime(client: httpx.Client) -> None:
    reply = client.post(
        "/tools",
        json={"tool": "read_file", "params": {"path": "x"}},
        headers={"x-tool-runtime": "docker-container:box"},
    )
    assert reply.status_code == 200 and "not available in a tool runtime" in reply.json()["error"]


# -- the server-side tool loop ---------------------------------------------------------------------
def test_the_tool_loop_runs_a_builtin_tool_in_the_requests_cwd(client: httpx.Client, tmp_path: Path) -> None:
    # Deterministic: the named tool_choice forces the call, the prompt spells its arguments (SmolLM2 at
    # temperature 0 copies them), and max_tool_rounds 1 makes the next round answer.
    (tmp_path / "notes.txt").write_text("the answer is 42\n")
    body = {
        "messages": [
            {"role": "user", "content": 'Read the file notes.txt: call read_file with {"path": "notes.txt"}.'}
        ],
        "tools": [{"type": "mcp", "server_label": "builtin", "allowed_tools": ["read_file"]}],
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
        "max_tool_rounds": 1,
        "temperature": 0,
        "max_tokens": 40,  # the call takes ~15; the answer may be cut,
    }
    reply = client.post("/v1/chat/completions", json=body, headers={"x-tool-cwd": str(tmp_path)})
    assert reply.status_code == 200, reply.text
    call_message, result_message = reply.json()["choices"][0]["intermediate_messages"]
    [tool_call] = call_message["tool_calls"]
    assert tool_call["function"]["name"] == "read_file"
    assert json.loads(tool_call["function"]["arguments"]) == {"path": "notes.txt"}
    assert result_message["content"] == "the answer is 42\n" and result_message["is_error"] is False


WRITE_ASKED = {
    "messages": [
        {
            "role": "user",
            "content": 'Write hello to notes.txt: call write_file with {"path": "notes.txt", '
            '"content": "hello"}.',
        }
    ],
    "tools": [{"type": "mcp", "server_label": "builtin", "allowed_tools": ["write_file"]}],
    "tool_choice": {"type": "function", "function": {"name": "write_file"}},
    "approved_tools": [],
    "max_tool_rounds": 1,
    "temperature": 0,
    "max_tokens": 60,
}


def test_an_unapproved_write_pauses_the_run_and_an_approval_resumes_it(
    client: httpx.Client, tmp_path: Path
) -> None:
    cwd = {"x-tool-cwd": str(tmp_path)}
    reply = client.post("/v1/chat/completions", json=WRITE_ASKED, headers=cwd)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["pending_approval"] == ["write_file"]
    assert choice["intermediate_messages"] == []  # nothing of the round ran
    [pending] = choice["message"]["tool_calls"]
    assert pending["function"]["name"] == "write_file"
    assert json.loads(pending["function"]["arguments"]) == {"path": "notes.txt", "content": "hello"}
    assert list(tmp_path.iterdir()) == []  # paused before the write

    # Sent again unapproved: a 400, and still nothing written.
    again = {**WRITE_ASKED, "messages": [*WRITE_ASKED["messages"], choice["message"]]}
    refused = client.post("/v1/chat/completions", json=again, headers=cwd)
    assert refused.status_code == 400 and "approved_tools" in refused.json()["error"]["message"]
    assert list(tmp_path.iterdir()) == []

    # Approved: the pending call runs first (its result streamed), then the model answers.
    with client.stream(
        "POST", "/v1/chat/completions", json={**again, "approved_tools": ["write_file"], "stream": True},
        headers=cwd,
    ) as stream:  # fmt: skip
        assert stream.status_code == 200
        chunks = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data: {")]
    first = chunks[0]["choices"][0]["delta"]
    assert first["role"] == "tool" and first["tool_call_id"] == pending["id"] and first["is_error"] is False
    assert (tmp_path / "notes.txt").read_text() == "hello"
    finish = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finish[-1]["finish_reason"] in ("stop", "length") and "pending_approval" not in finish[-1]
    assert any(c["choices"][0]["delta"].get("role") == "assistant" for c in chunks[1:] if c["choices"])


def test_a_denied_call_is_answered_by_the_client_and_the_model_goes_on(
    client: httpx.Client, tmp_path: Path
) -> None:
    cwd = {"x-tool-cwd": str(tmp_path)}
    paused = client.post("/v1/chat/completions", json=WRITE_ASKED, headers=cwd).json()["choices"][0]
    [pending] = paused["message"]["tool_calls"]
    denied = {"role": "tool", "tool_call_id": pending["id"], "content": "The user denied running write_file."}
    body = {**WRITE_ASKED, "messages": [*WRITE_ASKED["messages"], paused["message"], denied]}
    reply = client.post("/v1/chat/completions", json=body, headers=cwd)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    # the resumed run is past its forced round: the model answers (max_tool_rounds 1), nothing is written
    assert choice["finish_reason"] in ("stop", "length") and "pending_approval" not in choice
    assert choice["message"]["content"] and "tool_calls" not in choice["message"]
    assert list(tmp_path.iterdir()) == []


def test_without_approved_tools_a_write_runs_and_no_run_pauses(client: httpx.Client, tmp_path: Path) -> None:
    body = {key: value for key, value in WRITE_ASKED.items() if key != "approved_tools"}
    reply = client.post("/v1/chat/completions", json=body, headers={"x-tool-cwd": str(tmp_path)})
    choice = reply.json()["choices"][0]
    assert "pending_approval" not in choice and len(choice["intermediate_messages"]) == 2
    assert (tmp_path / "notes.txt").read_text() == "hello"


# -- /cors-proxy -----------------------------------------------------------------------------------
class Echo(BaseHTTPRequestHandler):
    """Answers with the method, path, headers and body it received, plus headers the proxy must drop."""

    def _answer(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        payload = json.dumps(
            {"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body}
        )
        self.send_response(201)
        for name, value in (("Content-Type", "application/json"), ("Access-Control-Allow-Origin", "*"),
                            ("Set-Cookie", "s=1"), ("X-Upstream", "yes")):  # fmt: skip
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload.encode())

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def echo_url() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_the_proxy_forwards_only_explicit_headers(srv: ServerProcess, echo_url: str) -> None:
    headers = {
        "X-Api-Key": KEY,
        "Cookie": "session=mine",
        "X-Custom": "not forwarded",
        "x-llama-server-proxy-header-X-Custom": "forwarded",
        "x-llama-server-proxy-header-Authorization": "Bearer for-the-mcp-server",
    }
    reply = httpx.post(
        srv.base_url + "/cors-proxy", params={"url": echo_url + "/mcp?x=1"}, headers=headers, content=b"{}"
    )
    assert reply.status_code == 201 and reply.headers["x-upstream"] == "yes"
    assert "access-control-allow-origin" not in reply.headers and "set-cookie" not in reply.headers
    seen = reply.json()
    assert seen["method"] == "POST" and seen["path"] == "/mcp?x=1" and seen["body"] == "{}"
    got = {k.lower(): v for k, v in seen["headers"].items()}
    assert got["x-custom"] == "forwarded" and got["authorization"] == "Bearer for-the-mcp-server"
    assert "cookie" not in got and "x-api-key" not in got and not any("proxy-header" in k for k in got)
    assert (
        httpx.get(
            srv.base_url + "/cors-proxy", params={"url": echo_url}, headers={"X-Api-Key": KEY}
        ).status_code
        == 201
    )


@pytest.mark.parametrize(
    "url", ["ftp://127.0.0.1/x", "file:///etc/passwd", "http://", "http://u:pw@127.0.0.1/", ""]
)
def test_the_proxy_refuses_other_urls(srv: ServerProcess, url: str) -> None:
    reply = httpx.get(srv.base_url + "/cors-proxy", params={"url": url}, headers={"X-Api-Key": KEY})
    assert reply.status_code == 400 and "'url'" in reply.json()["error"]["message"]


def test_the_proxy_is_403_without_its_flag(files_only: httpx.Client) -> None:
    for method in ("GET", "POST"):
        reply = files_only.request(method, "/cors-proxy?url=http://127.0.0.1:1/")
        assert reply.status_code == 403, reply.text
        assert reply.json()["error"]["type"] == "feature_disabled"
        assert "this feature is disabled" in reply.json()["error"]["message"]
