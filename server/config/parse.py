"""llama-server compatible command line (and LLAMA_ARG_* environment variables) -> Settings.

The variables' arguments come first and the command line's after them (it wins); flags with no effect
here are taken out and reported (`server/config/ignored_flags.py`), the rest parsed by
`server/config/flags.py`, then checked and converted (`server/config/checks.py`,
`server/config/flag_values.py`). Bad input exits 2 with a one-line reason.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from server.config import flag_values
from server.config.checks import (
    check_bounds,
    check_cache_types,
    check_cluster,
    check_draft_device,
    check_embd_normalize,
    check_limits,
    check_sleep_idle,
    check_tls,
)
from server.config.env_args import EnvError, env_arguments
from server.config.flags import build_parser
from server.config.ignored_flags import ALWAYS_ON, IGNORED_FLAGS, Ignored, split_ignored
from server.config.settings import Settings


def parse_settings(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[Ignored]]:
    """Settings from the command line and `LLAMA_ARG_*` variables (`environ`, else the process's),
    and the ignored flags to warn about. Bad input exits 2 with a one-line reason."""
    parser = build_parser()
    argv = dashed_names(parser, list(sys.argv[1:] if argv is None else argv))
    kept, ignored = _command_line(parser, argv, os.environ if environ is None else environ)
    args = parser.parse_args(kept)
    debug = (os.environ if environ is None else environ).get("LLAMA_SERVER_SLOTS_DEBUG", "")
    return Settings(**_settings_values(parser, args), slots_debug=_atoi(debug) != 0), ignored


def _atoi(text: str) -> int:
    """C's atoi, as llama-server reads its LLAMA_SERVER_* variables: the leading integer, else 0."""
    match = re.match(r"\s*[-+]?\d+", text)
    return int(match.group()) if match else 0


def dashed_names(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """llama-server reads `_` as `-` in a `--` flag's name (`--backend_sampling` is
    `--backend-sampling`): such a name is rewritten when only its dashed form is a flag, so a value that
    merely looks like a flag is never touched."""
    known = set(parser._option_string_actions) | set(IGNORED_FLAGS) | set(ALWAYS_ON)
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        dashed = name.replace("_", "-")
        if arg.startswith("--") and name not in known and dashed in known:
            arg = dashed + eq + value
        out.append(arg)
    return out


def _settings_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The Settings fields from the parsed flags, checked and converted in this order (the first
    problem is the one reported)."""
    keys = flag_values.api_keys(parser, args)
    check_bounds(parser, args)
    check_limits(parser, args)
    template = flag_values.chat_template(parser, args)
    values = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    values.update(api_keys=keys, chat_template=template, slot_similarity=args.slot_prompt_similarity)
    values.update(flag_values.cache_models(parser, args))  # before spec_params: -hfd is -md
    values["mcp_servers"] = flag_values.mcp_servers(parser, args)
    values["mcp_allow_hosts"] = flag_values.mcp_allow_hosts(parser, args)
    values["cors_origins"] = flag_values.cors_origins(args.cors_origins)
    values.update(flag_values.tool_settings(parser, args))
    values["api_prefix"] = flag_values.api_prefix(parser, args.api_prefix)
    values["ui_settings"] = flag_values.ui_settings(parser, args)
    kwargs = flag_values.json_object(parser, "--chat-template-kwargs", args.chat_template_kwargs)
    values["chat_template_kwargs"] = kwargs
    values.update(flag_values.default_constraint(parser, args))
    values["reverse_prompts"] = tuple(p for p in args.reverse_prompts if p)
    values["lora"], values["lora_named"] = flag_values.lora_adapters(parser, args)
    values["control_vectors"] = flag_values.control_vectors(parser, args)
    values["control_vector_layer_range"] = tuple(args.control_vector_layer_range or (-1, -1))
    check_tls(parser, args)
    values["spec"] = flag_values.spec_params(parser, args)
    values["sampling"] = flag_values.sampling_params(parser, args)
    values["log_file"] = Path(args.log_file) if args.log_file else None
    if args.log_prompts_dir:
        values["log_prompts_dir"] = Path(args.log_prompts_dir)
    values["slot_save_path"] = Path(args.slot_save_path) if args.slot_save_path else None
    values["responses_dir"] = Path(args.responses_dir) if args.responses_dir else None
    values["stream_journal"] = flag_values.stream_journal(parser, args.stream_journal)
    values["models_dir"] = Path(args.models_dir) if args.models_dir else None
    values["models_preset"] = Path(args.models_preset) if args.models_preset else None
    check_cluster(parser, args)
    check_sleep_idle(parser, args)
    if args.n_gpu_layers == 0:
        values["device"] = "cpu"
    check_draft_device(parser, args, values.get("device", args.device))
    if args.reranking:  # as llama-server: --reranking is --embedding with pooling rank
        values.update(embedding=True, pooling="rank")
    check_embd_normalize(parser, args)
    check_cache_types(parser, args)
    return values


def _command_line(
    parser: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str]
) -> tuple[list[str], list[Ignored]]:
    """The arguments to parse: the variables' first, then the command line's (which wins: a variable
    whose flag the command line gives is not read, and is reported); and what is ignored."""
    try:
        from_env = env_arguments(environ, argv)
    except EnvError as exc:
        parser.error(str(exc))
    kept: list[str] = []
    ignored: list[Ignored] = []
    for var in from_env.read:
        var_kept, var_ignored = split_ignored(list(var.args))
        kept += var_kept
        ignored += [Ignored(f"{var.env} ({flag})", flag.reason) for flag in var_ignored]
    for env, flag in from_env.overridden:
        ignored.append(Ignored(env, f"the command line's {flag} wins over the variable"))
    cli_kept, cli_ignored = split_ignored(argv)
    return kept + cli_kept, ignored + cli_ignored
