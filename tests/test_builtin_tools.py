"""The built-in tools' parts without a server: the working directory's confinement, the runtime's argv
and its refusals, globs, --tools parsing, and the CORS policy while tools are on (the HTTP behaviour is
tests/test_builtin_tools_server.py's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.app import create_app
from server.builtin_tools import NAMES, BadContext, Runtime, ToolContext, ToolError, Workdir, parse_tool_names
from server.builtin_tools.search import glob_regex
from server.config.parse import parse_settings
from server.config.settings import Settings


# -- the working directory -------------------------------------------------------------------------
def test_paths_resolve_inside_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    wd = Workdir.open(tmp_path)
    assert wd.resolve("sub/../a.txt") == tmp_path.resolve() / "a.txt"
    assert wd.resolve(str(tmp_path / "sub")) == tmp_path.resolve() / "sub"  # absolute, but inside
    assert wd.resolve(".") == tmp_path.resolve()


@pytest.mark.parametrize("path", ["..", "../x", "sub/../../x", "/etc/passwd", "link/passwd", "", "a\0b"])
def test_escaping_paths_are_refused(tmp_path: Path, path: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "link").symlink_to("/etc")
    with pytest.raises(ToolError):
        Workdir.open(tmp_path).resolve(path)


@pytest.mark.parametrize("cwd", ["relative/dir", "/no/such/dir", "FILE"])
def test_the_working_directory_must_be_an_existing_absolute_folder(tmp_path: Path, cwd: str) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(BadContext):
        Workdir.open(str(tmp_path / "f") if cwd == "FILE" else cwd)


# -- runtimes --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value",
    [
        "docker-container:--privileged",
        "podman-container:-v/:/host",
        "docker-container:",
        "docker-container:a b",
        "ssh:-oProxyCommand=touch /tmp/x",
        "ssh:",
        "ssh:user@host;rm",
        "docker:ubuntu",  # starting containers is not supported: only running ones
        "host",
        "kubectl:pod",
    ],
)
def test_bad_runtimes_are_refused(value: str) -> None:
    with pytest.raises(BadContext):
        Runtime.parse(value)


def test_runtime_argvs() -> None:
    docker = Runtime.parse("docker-container:my_box-1.2")
    inner = ["timeout", "-s", "KILL", "10s", "sh", "-c", "ls -l"]
    assert docker.argv("ls -l", "/work", 10) == ["docker", "exec", "-w", "/work", "--", "my_box-1.2", *inner]
    podman = Runtime.parse("podman-container:abc")
    assert podman.argv("true", None, 5)[:4] == ["podman", "exec", "--", "abc"]
    ssh = Runtime.parse("ssh:me@build.example")
    argv = ssh.argv("echo 'hi'", "/srv/my dir", 3)
    assert argv[0] == "ssh" and "BatchMode=yes" in argv and argv[-3:-1] == ["--", "me@build.example"]
    assert argv[-1] == "cd -- '/srv/my dir' && timeout -s KILL 3s sh -c 'echo '\"'\"'hi'\"'\"''"


def test_a_runtime_context_takes_only_an_explicit_absolute_cwd(tmp_path: Path) -> None:
    defaults = ToolContext(str(tmp_path))
    assert ToolContext.of(None, "ssh:box", defaults) == ToolContext(None, Runtime("ssh", "box"))
    with pytest.raises(BadContext):
        ToolContext.of("rel", "ssh:box", defaults)
    with pytest.raises(ToolError):  # the file tools act on this host only
        ToolContext.of("/srv", "ssh:box", defaults).host_workdir()


# -- globs -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "path", "hit"),
    [
        ("*.py", "a/b/c.py", True),  # no `/`: the basename
        ("*.py", "c.py", True),
        ("*.py", "c.pyc", False),
        ("**/*.py", "c.py", True),  # Llamba's `**/` also matches no folder (llama-server's does not)
        ("src/*.c", "x/src/a.c", True),
        ("src/*.c", "src/sub/a.c", False),  # `*` stays in its folder
        ("/src/*.c", "x/src/a.c", False),  # anchored at the base
        ("?.txt", "a.txt", True),
        ("[!a]*.txt", "b.txt", True),
        ("[!a]*.txt", "a.txt", False),
        ("**", "any/thing", True),
    ],
)
def test_glob_matching(pattern: str, path: str, hit: bool) -> None:
    assert bool(glob_regex(pattern).match(path)) is hit


# -- --tools and friends ---------------------------------------------------------------------------
def test_tool_names_parse_as_llama_server_reads_them() -> None:
    assert parse_tool_names("all") == NAMES
    assert parse_tool_names("edit_file,read_file,read_file") == ("read_file", "edit_file")  # fixed order
    for bad in ("none", "", "read_file, write_file", "Read_file"):  # no trimming, exact names
        with pytest.raises(ValueError, match="available tools: read_file, file_glob_search"):
            parse_tool_names(bad)


def test_tool_flags(capsys: pytest.CaptureFixture[str]) -> None:
    settings, _ = parse_settings(["--tools", "read_file,grep_search", "--tools-runtime", "ssh:box"], {})
    assert settings.tools == ("read_file", "grep_search") and settings.tools_runtime == "ssh:box"
    assert not settings.ui_mcp_proxy
    agent, _ = parse_settings(["-ag"], {})
    assert agent.tools == NAMES and agent.ui_mcp_proxy
    from_env, ignored = parse_settings([], {"LLAMA_ARG_TOOLS": "all", "LLAMA_ARG_UI_MCP_PROXY": "1"})
    assert from_env.tools == NAMES and from_env.ui_mcp_proxy and not ignored
    for argv in (["--tools", "read_file,nope"], ["--tools-runtime", "docker-container:--privileged"]):
        with pytest.raises(SystemExit) as exited:
            parse_settings(argv, {})
        assert exited.value.code != 0
    err = capsys.readouterr().err
    assert 'unknown tool "nope". available tools: read_file, file_glob_search' in err
    assert "invalid container id" in err


# -- CORS while tools are on -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cors_origins", "origin", "allowed"),
    [
        (None, "http://evil.example", False),
        (None, "http://localhost:5173", True),
        (None, "http://127.0.0.1", True),
        (None, "http://[::1]:8080", True),
        (None, "http://localhost.evil.example", False),
        (("http://app.example",), "http://app.example", True),  # an explicit --cors-origins wins
    ],
)
@pytest.mark.anyio
async def test_cors_is_localhost_only_with_tools(
    cors_origins: tuple | None, origin: str, allowed: bool
) -> None:
    # In process, as tests/test_mcp_server.py's test_cors_policy: the policy comes from the settings alone.
    app = create_app(Settings(tools=("read_file",), cors_origins=cors_origins))
    reply = await app.test_client().get("/health", headers={"Origin": origin})
    assert (reply.status_code != 403) is allowed
    assert (reply.headers.get("Access-Control-Allow-Origin") == origin) is allowed
