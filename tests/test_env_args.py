"""LLAMA_ARG_* variables read as llama-server reads them, API key sources, and every option the parser
knows reaches Settings (or is a check that exits 2): nothing parsed is dropped."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from server.config.env_args import env_rows
from server.config.flags import build_parser
from server.config.ignored_flags import ALWAYS_ON, IGNORED_FLAGS
from server.config.llama_server_flags import FLAGS
from server.config.parse import parse_settings
from server.config.print_and_exit import CacheList, CompletionBash
from server.config.settings import Settings
from server.router.child import ROUTER_ONLY_ENV, inherited_environ
from server.router.main import ROUTER_ONLY_FLAGS
from tests.server_process import ServerProcess


def test_a_value_variable_sets_its_flag_and_the_command_line_wins() -> None:
    settings, ignored = parse_settings([], {"LLAMA_ARG_CTX_SIZE": "1024", "LLAMA_ARG_N_PARALLEL": "3"})
    assert (settings.ctx_size, settings.parallel, ignored) == (1024, 3, [])
    settings, ignored = parse_settings(["-c", "2048"], {"LLAMA_ARG_CTX_SIZE": "1024"})
    assert settings.ctx_size == 2048
    assert ignored == ["LLAMA_ARG_CTX_SIZE"] and "-c wins" in ignored[0].reason  # type: ignore[attr-defined]


def test_a_negative_value_stays_a_value() -> None:
    settings, _ = parse_settings([], {"LLAMA_ARG_N_PREDICT": "-1", "LLAMA_ARG_N_GPU_LAYERS": "0"})
    assert settings.n_predict == -1 and settings.n_gpu_layers == 0 and settings.device == "cpu"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({"LLAMA_ARG_CONTEXT_SHIFT": "1"}, True),
        ({"LLAMA_ARG_CONTEXT_SHIFT": "enabled"}, True),
        ({"LLAMA_ARG_CONTEXT_SHIFT": "off"}, False),
        ({"LLAMA_ARG_NO_CONTEXT_SHIFT": "1"}, False),  # llama.cpp's negative twin, whatever its value
    ],
)
def test_switches_take_truthy_and_falsey_words(environ: dict[str, str], on: bool) -> None:
    assert parse_settings([], environ)[0].context_shift is on
    assert parse_settings(["--context-shift"], {**environ})[0].context_shift is True  # the CLI wins


def test_a_switch_with_another_word_exits_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings([], {"LLAMA_ARG_ENDPOINT_METRICS": "yes"})
    assert exit_info.value.code == 2
    assert "LLAMA_ARG_ENDPOINT_METRICS='yes': --metrics is a switch" in capsys.readouterr().err


def test_ignored_flags_set_by_variables() -> None:
    _, ignored = parse_settings([], {"LLAMA_ARG_FLASH_ATTN": "on", "LLAMA_ARG_CONT_BATCHING": "0"})
    assert ignored == ["LLAMA_ARG_FLASH_ATTN (--flash-attn)", "LLAMA_ARG_CONT_BATCHING (-nocb)"]
    assert "batch invariance" in ignored[1].reason  # type: ignore[attr-defined]
    assert parse_settings([], {"LLAMA_ARG_CONT_BATCHING": "1", "LLAMA_ARG_JINJA": "on"})[1] == []
    # Flags Llamba cannot honour are accepted too, with a warning that says so (llama-server's command
    # lines and environments must start Llamba unchanged).
    for env, flag in (("LLAMA_ARG_ROPE_SCALE", "--rope-scale"), ("LLAMA_ARG_JINJA", "--no-jinja")):
        _, ignored = parse_settings([], {env: "2" if env.endswith("SCALE") else "false"})
        assert ignored == [f"{env} ({flag})"]
        assert ignored[0].reason.startswith("not applied: Llamba does not implement it")  # type: ignore[attr-defined]


def test_every_variable_of_the_table_sets_what_its_flag_sets() -> None:
    """Each implemented row's variable, set to a value its flag takes, gives the Settings that the flag
    with that value gives on the command line, and nothing ignored."""
    samples = {
        "N": "2",
        "SECONDS": "5",
        "P": "0.5",
        "MODE": "mmap",
        "FORMAT": "none",
        "{none,mean,cls,last,rank}": "mean",
    }
    checked = []
    for env, rows in env_rows().items():
        row = rows[0]
        if row.status != "implemented" or row.forms[0] in ("--models-dir", "--models-preset"):
            continue
        value = samples.get(row.value, "1" if not row.value else None)
        if value is None:
            continue  # a file, a template, a device: each has its own test
        argv = [row.forms[0], value] if row.value else [row.forms[0]]
        assert parse_settings([], {env: value}) == (parse_settings(argv, {})[0], []), (env, argv)
        checked.append(env)
    assert len(checked) >= 50, checked  # the table's 51 rows with a sample value (not a vacuous loop)


def test_api_keys_from_every_source(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nfile-key-1\n\n  file-key-2  \n#off\n")
    environ = {"LLAMA_ARG_API_KEY_FILE": str(keys), "LLAMA_API_KEY": 'env-1,"env,2"'}
    settings, _ = parse_settings(["--api-key", "cli-1,cli-2", "--api-key", "cli-3"], environ)
    # The command line's --api-key wins over LLAMA_API_KEY; the file is its own flag, so it adds.
    assert settings.api_keys == ("cli-1", "cli-2", "cli-3", "file-key-1", "file-key-2")
    assert parse_settings([], environ)[0].api_keys == ("env-1", "env,2", "file-key-1", "file-key-2")
    assert parse_settings([], {"LLAMA_ARG_API_KEY": "router-secret"})[0].api_keys == ("router-secret",)


def test_a_missing_key_file_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_settings(["--api-key-file", str(tmp_path / "none")], {})
    assert exit_info.value.code == 2 and "cannot read --api-key-file" in capsys.readouterr().err


def test_router_children_do_not_inherit_the_routers_own_variables() -> None:
    wanted = {
        env for env, rows in env_rows().items() for row in rows if set(row.forms) & set(ROUTER_ONLY_FLAGS)
    }
    wanted |= {env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") for env in wanted if "AUTOLOAD" in env}
    assert wanted == ROUTER_ONLY_ENV
    assert inherited_environ({"LLAMA_ARG_ALIAS": "a", "LLAMA_ARG_CTX_SIZE": "1"}) == {
        "LLAMA_ARG_CTX_SIZE": "1"
    }


# -- every parsed option is consumed ---------------------------------------------------------------
# Options whose value is only checked: a value other than the target's device exits 2.
# The TLS files go together (tests/test_server_core.py serves HTTPS with both): one alone exits 2.
# -hf/-hff/-hfd: a name the (tests' empty) llama.cpp cache lacks exits 2; tests/test_llama_server_flags.py
# has them find their files.
CHECKS = {"device_draft": ["-devd", "cuda"], "gpu_layers_draft": ["-dev", "cuda", "-ngld", "0"],
          "ssl_key_file": ["--ssl-key-file", "README.md"],
          "ssl_cert_file": ["--ssl-cert-file", "README.md"], "hf_repo": ["-hf", "org/absent"],
          "hf_file": ["-hff", "x.gguf"], "hf_repo_draft": ["-hfd", "org/absent"]}  # fmt: skip
EXITING = (argparse._HelpAction, argparse._VersionAction, CacheList, CompletionBash)
MCP = {"mcpServers": {"a": {"command": "true"}}}


def _values(action: argparse.Action, files: dict[str, str]) -> list[list[str]]:
    """Values to try for one option, the first that parses being used."""
    special = {
        "samplers": "top_k;temperature", "sampler_seq": "kt", "logit_bias": "15+1",
        "spec_type": "ngram-simple", "mcp_servers_json": json.dumps(MCP), "cache_type_k": "q8_0",
        "cache_type_v": "q8_0", "cluster": "ray", "chat_template_kwargs": '{"a": 1}',
        "json_schema": '{"type": "object"}', "tools": "read_file,grep_search",
        "tools_runtime": "docker-container:box", "log_colors": "on", "lora_items": "a.gguf:0.5",
        "lora_modules": "sql=a.gguf", "control_vector_items": "c.gguf:0.5", "ui_config": '{"theme": "dark"}',
        **files,
    }  # fmt: skip
    if action.nargs == 0:
        return [[]]
    if action.nargs == 2 and action.type is int:  # --control-vector-layer-range START END
        return [["1", "5"]]
    if action.dest in special:
        return [[special[action.dest]]]
    if action.choices:
        return [[str(c)] for c in action.choices if c != action.default]
    default: Any = action.default
    if action.type is int:
        return [[str(v)] for v in ((default or 0) + 1, (default or 0) + 2, 1, 5)]
    if action.type is float:
        return [[str(v)] for v in ((default or 0) / 2, (default or 0) * 2, 0.5, 5.0)]
    return [["x"]]


def test_every_parsed_option_reaches_settings(tmp_path: Path) -> None:
    """Each option of the parser, given a value, changes Settings (or is a check that exits 2 on a
    mismatch); llama-server's ignored and always-on flags are never parser options."""
    (tmp_path / "t.jinja").write_text("{{ messages }}")
    (tmp_path / "keys").write_text("k\n")
    (tmp_path / "mcp.json").write_text(json.dumps(MCP))
    (tmp_path / "g.gbnf").write_text('root ::= "a"')
    (tmp_path / "s.json").write_text('{"type": "object"}')
    files = {"chat_template_file": str(tmp_path / "t.jinja"), "api_key_file": str(tmp_path / "keys"),
             "mcp_servers_config": str(tmp_path / "mcp.json"), "grammar_file": str(tmp_path / "g.gbnf"),
             "json_schema_file": str(tmp_path / "s.json"),
             "ui_config_file": str(tmp_path / "s.json")}  # fmt: skip
    base = parse_settings([], {})[0]
    parser = build_parser()
    assert not set(parser._option_string_actions) & (set(IGNORED_FLAGS) | set(ALWAYS_ON))
    for action in parser._actions:
        if isinstance(action, EXITING) or action.dest == "list_devices" or not action.option_strings:
            continue
        if action.dest in CHECKS:
            with pytest.raises(SystemExit):
                parse_settings(CHECKS[action.dest], {})
            continue
        if action.nargs == 0 and getattr(action, "const", None) == parser.get_default(action.dest):
            _check_undoes_its_opposite(parser, action, base)  # --slots, --no-context-shift: the default side
            continue
        assert _changes_settings(action, _values(action, files), base), f"{action.option_strings} is dropped"


def _check_undoes_its_opposite(
    parser: argparse.ArgumentParser, action: argparse.Action, base: Settings
) -> None:
    other = next(a for a in parser._actions if a.dest == action.dest and a is not action)
    flipped = parse_settings([other.option_strings[-1]], {})[0]
    assert (
        flipped != base
        and parse_settings([other.option_strings[-1], action.option_strings[-1]], {})[0] == base
    )


# Options that mean something only beside another (each alone exits 2 naming what it needs).
NEEDS = {
    name: ["--cluster", "ray"]
    for name in (
        "replicas",
        "replicas_min",
        "replicas_max",
        "scale_up_after",
        "scale_down_after",
        "placement",
    )
}


def _changes_settings(action: argparse.Action, candidates: list[list[str]], base: Settings) -> bool:
    needs = NEEDS.get(action.dest, [])
    if needs:
        base = parse_settings(needs, {})[0]
    for value in candidates:
        try:
            settings = parse_settings([*needs, action.option_strings[-1], *value], {})[0]
        except SystemExit:
            continue
        if settings != base:
            return True
    return False


def test_always_on_switches_are_implemented_rows() -> None:
    for form, note in ALWAYS_ON.items():
        row = next(flag for flag in FLAGS if form in flag.forms)
        assert row.status == "implemented" and row.note == note and not row.value


def test_a_real_start_with_a_variable_llamba_cannot_honour_warns_and_serves() -> None:
    proc = ServerProcess("-m", "smollm2", env={"LLAMA_ARG_ROPE_SCALE": "2", "LLAMA_ARG_CTX_SIZE": "512"})
    try:
        proc.wait_healthy()
        log = proc.log_path.read_text()
        assert "LLAMA_ARG_ROPE_SCALE (--rope-scale)" in log and "not applied" in log
    finally:
        proc.stop()
