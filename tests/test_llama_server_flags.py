"""Every flag in llama-server's README table parses as its status says, a long llama-server command
line starts a real server, and docs/compatibility.md is current."""

from __future__ import annotations

import argparse

import httpx
import pytest

from scripts.compatibility_doc import DOC, render
from server.cli import build_parser, parse_settings
from server.llama_server_flags import FLAGS, LlamaServerFlag
from tests.server_process import ServerProcess

STATUSES = ("implemented", "ignored", "refused")
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


def test_refused_rows_exit_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    for flag in _rows("refused"):
        for form in flag.forms:
            with pytest.raises(SystemExit) as exit_info:
                parse_settings([form, "x"] if flag.value else [form])
            assert exit_info.value.code == 2, form
            err = capsys.readouterr().err.strip().splitlines()[-1]
            assert f"{form} is not supported by Llamba: {flag.note}" in err


def test_compatibility_doc_is_current() -> None:
    assert DOC.read_text() == render(), "run .venv/bin/python scripts/compatibility_doc.py"
    for flag in FLAGS:
        assert f"`{flag.forms[0]}`" in DOC.read_text()


def test_a_long_llama_server_command_line_starts_and_serves() -> None:
    """One real start with every ignored flag and many implemented ones, spelled as llama-server's
    users write them; each ignored flag gets its warning line and the server answers."""
    implemented = ["-m", "smollm2", "--predict", "8", "-ngl", "0", "--gpu-layers", "0", "-np", "2",
                   "-c", "2048", "-b", "512", "-ub", "256", "--temp", "0", "--top-k", "1", "--jinja",
                   "--metrics", "--slots", "--webui", "-to", "60", "--log-verbose", "-cram", "64",
                   "-dev", "cpu", "--reasoning-format", "auto", "--cont-batching"]  # fmt: skip
    proc = ServerProcess(*implemented, *_ignored_argv()).wait_healthy(timeout=300)
    try:
        reply = httpx.post(proc.base_url + "/completion", json={"prompt": "Hello"}, timeout=120)
        assert reply.status_code == 200 and reply.json()["tokens_predicted"] <= 8
        log = proc.log_path.read_text()
        for flag in _rows("ignored"):
            for form in flag.forms:
                assert f"flag={form} " in log or f"flag={form}\n" in log, f"no warning for {form}"
    finally:
        proc.stop()
