"""Every flag in llama-server's README table parses as its status says, a long llama-server command
line starts a real server, and docs/compatibility.md is current."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from scripts.compatibility_doc import DOC, render
from server.config.flags import build_parser
from server.config.ignored_flags import ALWAYS_ON
from server.config.llama_server_flags import FLAGS, LlamaServerFlag
from server.config.parse import parse_settings
from tests.hub_cache import add_file
from tests.server_process import LIVENESS_S, ServerProcess

STATUSES = ("implemented", "ignored")
# Implemented flags that exit instead of serving (help, version, device list).
EXITING = ("-h", "--version", "--list-devices")


def _rows(status: str) -> list[LlamaServerFlag]:
    return [flag for flag in FLAGS if flag.status == status]


def _ignored_argv() -> list[str]:
    """Every ignored flag, every form, with a value where it takes one (any value: none is used)."""
    argv: list[str] = []
    for flag in _rows("ignored"):
        for form in flag.forms:
            argv += [form, "on"] if flag.value else [form]
    return argv


def test_every_row_has_a_known_status() -> None:
    assert len(FLAGS) > 200  # the README's whole option table, not a fragment of it
    assert {flag.status for flag in FLAGS} == set(STATUSES)
    forms = [form for flag in FLAGS for form in flag.forms]
    assert len(forms) == len(set(forms)), "a form in two rows"


def test_implemented_rows_parse_with_their_arity() -> None:
    actions = build_parser()._option_string_actions
    for flag in _rows("implemented"):
        for form in flag.forms:
            if form in ALWAYS_ON:  # accepted switches, not parser options
                assert not flag.value
                continue
            assert form in actions, f"{form} (implemented) is not a flag of llamba-server"
            action = actions[form]
            if isinstance(action, argparse._HelpAction | argparse._VersionAction) or form in EXITING:
                continue
            takes_value = action.nargs != 0
            assert takes_value == bool(flag.value), f"{form}: takes a value here: {takes_value}"


def test_ignored_rows_are_accepted_and_reported() -> None:
    argv = _ignored_argv()
    settings, ignored = parse_settings(["-m", "smollm2", *argv, "-c", "2048"])
    assert settings.ctx_size == 2048  # the flag after them still parsed: values were consumed right
    expected = [form for flag in _rows("ignored") for form in flag.forms]
    assert ignored == expected


@pytest.mark.parametrize("spelled", ["--flash-attn on", "--flash-attn", "-fa=on"])
def test_an_optional_value_is_taken_only_when_given(spelled: str) -> None:
    settings, ignored = parse_settings([*spelled.split(), "-n", "7"])
    assert settings.n_predict == 7 and ignored == [spelled.split()[0].split("=")[0]]


def test_the_flags_that_print_and_exit(capsys: pytest.CaptureFixture[str]) -> None:
    """-cl lists the model cache and --completion-bash prints a completion script that bash runs, each
    then exiting 0 (as llama-server's do)."""
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["-cl"])
    listing = capsys.readouterr().out
    assert exit_info.value.code == 0 and listing.startswith("number of models in cache: ")
    assert "smollm2 (" in listing  # the suite's set-up fetched it
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--completion-bash"])
    script = capsys.readouterr().out
    assert exit_info.value.code == 0
    complete = 'COMP_WORDS=(llamba-server "$1"); COMP_CWORD=1; _llamba_server; echo "${COMPREPLY[@]}"'
    cases = (("--ctx-size-d", {"--ctx-size-draft"}), ("--rope-sc", {"--rope-scale", "--rope-scaling"}))
    for typed, expected in cases:
        words = subprocess.run(
            ["bash", "-c", f"{script}\n{complete}", "_", typed], capture_output=True, text=True, check=True
        ).stdout.split()
        assert set(words) == expected, (typed, words)


def test_compatibility_doc_is_current() -> None:
    assert DOC.read_text() == render(), "run .venv/bin/python scripts/compatibility_doc.py"
    for flag in FLAGS:
        assert f"`{flag.forms[0]}`" in DOC.read_text()


# A flag the long command line sets by its variable instead (ignored: the variable must warn).
BY_VARIABLE = "--swa-full"


def test_a_long_llama_server_command_line_starts_and_serves(tmp_path: Path) -> None:
    """One real start with every ignored flag and many implemented ones, spelled as llama-server's
    users write them (`--host` an address and a unix socket), plus variables (one the command line
    overrides, an ignored one, the key file); each ignored flag gets its warning line, the server
    answers with the keys of the file and the variable, and -to 1 bounds a request body without
    cutting a longer stream."""
    implemented = ["-m", "smollm2", "--predict", "160", "-ngl", "0", "--gpu-layers", "0", "-c", "2048",
                   "-b", "512", "-ub", "256", "--temp", "0", "--top-k", "1", "--jinja", "--metrics",
                   "--slots", "--webui", "-to", "1", "--log-verbose", "-cram", "64", "-dev", "cpu",
                   "--reasoning-format", "auto", "--cont-batching", "-a", "mini,small",
                   "--tags", "fast,tiny", "--props"]  # fmt: skip
    sock = tmp_path / "llamba.sock"  # --host: an address and a unix socket, both served
    implemented += ["--host", f"127.0.0.1,{sock}"]
    keys = tmp_path / "keys"
    keys.write_text("# the team's key\nfile-key\n")
    env = {"LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_N_PARALLEL": "2", "LLAMA_ARG_SWA_FULL": "1",
           "LLAMA_ARG_API_KEY_FILE": str(keys), "LLAMA_API_KEY": "env-key"}  # fmt: skip
    argv = [arg for arg in _ignored_argv() if arg != BY_VARIABLE]
    proc = ServerProcess(*implemented, *argv, env=env).wait_healthy(timeout=300)
    try:
        _check_keys_and_variables(proc.base_url)
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock))) as unix:
            assert unix.get("http://llamba/props", headers=AUTH).json()["total_slots"] == 2
        changed = httpx.post(proc.base_url + "/props", json={}, headers=AUTH)  # --props is among the flags
        assert changed.status_code == 200 and changed.json() == {"success": True}
        named = httpx.post(proc.base_url + "/props", json={"n_ctx": 1}, headers=AUTH)
        assert named.status_code == 400 and "n_ctx" in named.json()["error"]["message"]
        listed = httpx.get(proc.base_url + "/v1/models", headers=AUTH).json()["data"][0]
        named_as = (listed["id"], listed["aliases"], listed["tags"])
        assert named_as == ("mini", ["mini", "small"], ["fast", "tiny"])  # the id among the aliases
        body = {
            "prompt": "Hello",
            "ignore_eos": True,
        }  # --predict is the default and the cap (llama-server's)
        reply = httpx.post(proc.base_url + "/completion", json=body, headers=AUTH, timeout=120)
        assert reply.status_code == 200 and reply.json()["tokens_predicted"] == 160
        _check_timeouts(proc)
        log = proc.log_path.read_text()
        for flag in _rows("ignored"):
            for form in flag.forms:
                if form != BY_VARIABLE:
                    assert f"flag={form} " in log or f"flag={form}\n" in log, f"no warning for {form}"
        assert "LLAMA_ARG_SWA_FULL (--swa-full)" in log and "LLAMA_ARG_CTX_SIZE" in log
    finally:
        proc.stop()


AUTH = {"Authorization": "Bearer file-key"}


def _check_keys_and_variables(base_url: str) -> None:
    """Keys from the file and from LLAMA_API_KEY are accepted, a wrong one is a 401; -np came from its
    variable and -c from the command line, which wins over LLAMA_ARG_CTX_SIZE."""
    assert httpx.get(base_url + "/props").status_code == 401
    assert httpx.get(base_url + "/props", headers={"Authorization": "Bearer nope"}).status_code == 401
    assert httpx.get(base_url + "/props", headers={"Authorization": "Bearer env-key"}).status_code == 200
    props = httpx.get(base_url + "/props", headers=AUTH).json()
    assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024


def _check_timeouts(proc: ServerProcess) -> None:
    """-to 1: a body that stops arriving is a 408 within a few seconds; a stream that runs longer than a
    second while the client sends nothing is not cut (hypercorn's own read_timeout would cut it)."""
    with socket.create_connection(("127.0.0.1", proc.port), timeout=2 * LIVENESS_S) as conn:
        head = f"POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: {AUTH['Authorization']}\r\n"
        conn.sendall((head + "Content-Type: application/json\r\nContent-Length: 50\r\n\r\n{").encode())
        started = time.monotonic()
        answer = conn.recv(4096).decode()
        # Liveness bound: the server's 1 s -to answered, not the socket's own timeout (twice the bound).
        assert answer.startswith("HTTP/1.1 408") and time.monotonic() - started < LIVENESS_S, answer
    body = {"prompt": "Count:", "n_predict": 160, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", proc.base_url + "/completion", json=body, headers=AUTH, timeout=120) as reply:
        lines = reply.iter_lines()
        first = next(lines)
        time.sleep(1.5)  # silent for longer than -to, while the generation runs on
        chunks = [json.loads(line[6:]) for line in [first, *lines] if line.startswith("data: ")]
    assert chunks[-1]["stop"] is True and chunks[-1]["tokens_predicted"] == 160


def test_hf_flags_take_models_from_the_llama_cpp_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """-hf/-hff/-hfd name files of llama.cpp's cache (offline): -hf is the model (and its API name unless
    -a gives one), -hfd the draft (draft-simple, as -md); a name the cache lacks, -hf with -m, or -hff
    alone exit 2 saying why; -cl lists the cache's models."""
    cache = tmp_path / "llama-cache"
    monkeypatch.setenv("LLAMA_CACHE", str(cache))
    q8 = add_file(cache, "org/tiny-GGUF", "tiny-Q8_0.gguf", b"GGUF q8")
    draft = add_file(cache, "org/draft-GGUF", "draft-Q4_K_M.gguf", b"GGUF draft")
    settings, _ = parse_settings(["-hf", "org/tiny-GGUF:Q8_0", "-hfd", "org/draft-GGUF"])
    assert (settings.model, settings.model_draft) == (str(q8), str(draft))
    assert settings.model_alias == "org/tiny-GGUF:Q8_0" and settings.spec.types == ("draft-simple",)
    settings, _ = parse_settings(["-hf", "org/tiny-GGUF", "-hff", "tiny-Q8_0.gguf", "-a", "tiny"])
    assert (settings.model, settings.model_alias) == (str(q8), "tiny")
    for argv, says in (
        (["-hf", "org/tiny-GGUF:Q2_K"], "is not in llama.cpp's cache"),
        (["-hf", "org/tiny-GGUF", "-m", "smollm2"], "both name the model"),
        (["-hff", "tiny-Q8_0.gguf"], "--hf-file needs -hf"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            parse_settings(argv)
        assert exit_info.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_settings(["-cl"])
    assert f"org/tiny-GGUF:Q8_0 ({q8})" in capsys.readouterr().out
