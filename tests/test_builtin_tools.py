"""The built-in tools' parts without a server: the working directory's confinement, the runtime's argv
and its refusals, globs, the search tools' file list (git's, else .gitignore's rules) and their regex
timeout, --tools parsing, and the CORS policy while tools are on (the HTTP behaviour is
tests/test_builtin_tools_server.py's)."""

from __future__ import annotations

import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from server.app import create_app
from server.builtin_tools import NAMES, BadContext, Runtime, ToolContext, ToolError, Workdir, parse_tool_names
from server.builtin_tools.search import FileGlobSearch, GrepSearch, file_glob_search, glob_regex, grep_search
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


def test_with_the_shell_tool_paths_are_not_confined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # llama-server's reading (exec_shell_command reaches every path anyway, server/app.py): relative to
    # the working directory, absolute anywhere, `~` the home folder.
    wd, other = tmp_path / "wd", tmp_path / "other"
    wd.mkdir()
    other.mkdir()
    monkeypatch.setenv("HOME", str(other))
    free = Workdir.open(wd, confined=False)
    assert free.resolve("a.txt") == wd.resolve() / "a.txt"
    assert free.resolve(str(other / "x.txt")) == other.resolve() / "x.txt"
    assert free.resolve("../other") == other.resolve()
    assert free.resolve("~/x.txt") == other.resolve() / "x.txt"
    assert free.resolve("~") == other.resolve()
    with pytest.raises(ToolError):  # `~` is expanded, then confined like any other path
        Workdir.open(wd).resolve("~/x.txt")
    assert ToolContext.of(str(wd), None, ToolContext(str(tmp_path), confined=False)).workdir() == free
    assert ToolContext.of(None, None, ToolContext(str(wd))).workdir().confined


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


# -- the search tools' file list: git's, else .gitignore's rules --------------------------------------
TREE = {
    "a.py": "hit\n",
    "debug.log": "hit\n",  # *.log is ignored
    "build/out.py": "hit\n",  # build/ is ignored: its folder is not listed either
    "pkg/b.py": "hit\n",
    "pkg/keep.log": "hit\n",  # pkg/.gitignore's `!keep.log` wins over the root's *.log
    "pkg/.gitignore": "!keep.log\nsecret/\n",
    "pkg/secret/key.py": "hit\n",  # pkg/.gitignore's secret/
    ".gitignore": "*.log\nbuild/\n",
}
VISIBLE = ["a.py", "pkg/b.py", "pkg/keep.log"]


def make_tree(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def git(root: Path, *args: str) -> None:
    who = ["-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", *who, *args], cwd=root, check=True, capture_output=True)


def searched(root: Path, **params: Any) -> tuple[list[str], list[str]]:
    """The files grep_search finds `hit` in, and what file_glob_search lists (files and folders)."""
    wd = Workdir.open(root)
    grep = grep_search(GrepSearch(path=".", pattern="hit", **params), wd)["plain_text_response"]
    found = sorted(line.split(":", 1)[0] for line in grep.splitlines() if line.endswith(":hit"))
    listed = file_glob_search(FileGlobSearch(path=".", type="all", **params), wd)["entries"]
    return found, sorted(e["path"] for e in listed)


def test_outside_git_the_gitignore_files_rule_the_search(tmp_path: Path) -> None:
    make_tree(tmp_path, TREE)
    found, listed = searched(tmp_path)
    assert found == VISIBLE
    assert listed == [".gitignore", "a.py", "pkg", "pkg/.gitignore", "pkg/b.py", "pkg/keep.log"]
    # A search from a subfolder still obeys the .gitignore files above it.
    assert grep_search(GrepSearch(path="pkg", pattern="hit"), Workdir.open(tmp_path))[
        "plain_text_response"
    ] == ("b.py:hit\nkeep.log:hit\n\n---\nTotal matches: 2\n")


def test_in_a_git_work_tree_git_lists_the_files(tmp_path: Path) -> None:
    make_tree(tmp_path, {**TREE, "tracked.log": "hit\n", "node_modules/m.py": "hit\n"})
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-f", "tracked.log")  # tracked despite *.log: git lists it, as it should
    git(tmp_path, "commit", "-qm", "one tracked file")
    (tmp_path / ".git" / "info" / "exclude").write_text("a.py\n")  # the repository's own excludes count too
    found, listed = searched(tmp_path)
    # untracked and not ignored: listed; node_modules too (git decides, not the walk's junk list)
    assert found == ["node_modules/m.py", "pkg/b.py", "pkg/keep.log", "tracked.log"]
    assert listed == [  # folders: those that hold listed files
        ".gitignore", "node_modules", "node_modules/m.py", "pkg", "pkg/.gitignore", "pkg/b.py",
        "pkg/keep.log", "tracked.log",
    ]  # fmt: skip
    (tmp_path / "tracked.log").unlink()  # deleted but still in the index: not listed
    assert searched(tmp_path)[0] == ["node_modules/m.py", "pkg/b.py", "pkg/keep.log"]


def test_junk_folders_are_listed_but_never_entered(tmp_path: Path) -> None:
    # llama-server's rule: a page may pick `build` as a working directory, its files are never walked.
    make_tree(tmp_path, {"build/nested/x.txt": "x", "build/artifact.txt": "x", "src/main.cpp": "x"})
    (tmp_path / "node_modules").mkdir()
    wd = Workdir.open(tmp_path)

    def listed(**params: Any) -> list[str]:
        return [e["path"] for e in file_glob_search(FileGlobSearch(path=".", **params), wd)["entries"]]

    assert listed(type="dir", max_depth=1) == ["build", "node_modules", "src"]
    assert listed(type="all") == ["build", "node_modules", "src", "src/main.cpp"]
    assert listed() == ["src/main.cpp"]


@pytest.mark.parametrize(
    ("params", "error"),
    [
        ({"type": "bogus"}, 'invalid type: bogus (expected "file", "dir" or "all")'),
        ({"limit": 0}, "invalid limit: 0 (expected 1 or more)"),
    ],
)
def test_glob_search_type_and_limit_are_the_tools_to_check(
    tmp_path: Path, params: dict[str, Any], error: str
) -> None:
    # The tool's own errors, as llama-server answers them (a 200 `{"error"}` the model reads), not a 400.
    with pytest.raises(ToolError, match=re.escape(error)):
        file_glob_search(FileGlobSearch(path=".", **params), Workdir.open(tmp_path))


def test_max_depth_and_limit(tmp_path: Path) -> None:
    make_tree(tmp_path, {"top.txt": "", "a/mid.txt": "", "a/b/deep.txt": ""})
    wd = Workdir.open(tmp_path)

    def text(**params: Any) -> str:
        return str(file_glob_search(FileGlobSearch(path=".", **params), wd)["plain_text_response"])

    assert text(max_depth=1).startswith("top.txt\n\n---\nTotal matches: 1")
    assert "a/mid.txt" in text(max_depth=2) and "deep" not in text(max_depth=2)
    limited = file_glob_search(FileGlobSearch(path=".", limit=1), wd)
    assert len(limited["entries"]) == 1 and "Total matches: 3" in limited["plain_text_response"]


def test_a_catastrophic_pattern_is_a_tool_error_and_frees_its_thread(tmp_path: Path) -> None:
    (tmp_path / "long.txt").write_text("a" * 20000 + "!\n")
    outcome: list[BaseException | dict[str, Any]] = []

    def run() -> None:
        try:
            outcome.append(grep_search(GrepSearch(path=".", pattern="(a+)+$"), Workdir.open(tmp_path), 0.5))
        except ToolError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(60)  # a liveness bound: with `re` the thread would spin here for good
    assert not worker.is_alive(), "the search never ended"
    assert isinstance(outcome[0], ToolError), outcome
    assert "took longer than 0.5 s (--tools-regex-timeout)" in str(outcome[0])


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
    assert settings.tools_regex_timeout == 5.0
    assert parse_settings(["--tools-regex-timeout", "0.5"], {})[0].tools_regex_timeout == 0.5
    bad = (["--tools", "read_file,nope"], ["--tools-runtime", "docker-container:--privileged"],
           ["--tools-regex-timeout", "0"])  # fmt: skip
    for argv in bad:
        with pytest.raises(SystemExit) as exited:
            parse_settings(argv, {})
        assert exited.value.code != 0
    err = capsys.readouterr().err
    assert 'unknown tool "nope". available tools: read_file, file_glob_search' in err
    assert "invalid container id" in err and "--tools-regex-timeout must be > 0 seconds, got 0.0" in err


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
