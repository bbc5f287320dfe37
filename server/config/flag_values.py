"""The parsed flags' values as `Settings` values: files read, JSON parsed, lists split, the sampling and
speculation flags built into the engine's parameter types. A value that cannot be one exits 2 with a
one-line reason naming its flag (argparse's `parser.error`).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import tempfile
from pathlib import Path
from typing import Any

from engine import hf_cache
from engine.sampling import NUMBER_FIELDS, SamplingParams, parse_samplers
from engine.speculative import SPEC_TYPES, SpecParams
from server.builtin_tools import BadContext, Runtime, parse_tool_names
from server.config.json_schema import check_schema
from server.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers
from server.mcp.egress import HostPolicy


def api_keys(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """llama-server's key sources: each --api-key a comma-separated list (CSV quoting, so a key may
    hold a comma in quotes), and --api-key-file, one key per line, lines starting with # comments."""
    keys = [k for value in args.api_key or [] for row in csv.reader([value]) for k in row if k]
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text().splitlines()
        except OSError as exc:
            parser.error(f"cannot read --api-key-file: {exc}")
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return tuple(dict.fromkeys(keys))


def chat_template(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """--chat-template, or --chat-template-file's text when given."""
    if args.chat_template_file:
        return _read(parser, "--chat-template-file", args.chat_template_file)
    return args.chat_template


def mcp_servers(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[McpServerConfig, ...]:
    """--mcp-servers-config and --mcp-servers-json, validated now: a bad config never starts a server."""
    try:
        return load_mcp_servers(args.mcp_servers_config, args.mcp_servers_json)
    except McpConfigError as exc:
        parser.error(str(exc))


def mcp_allow_hosts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """--mcp-allow-hosts, comma-separated; a pattern that is no host, wildcard, address or network
    exits 2 naming it."""
    patterns = tuple(p.strip() for p in (args.mcp_allow_hosts or "").split(",") if p.strip())
    try:
        HostPolicy.parse(patterns)
    except ValueError as exc:
        parser.error(f"--mcp-allow-hosts: {exc}")
    return patterns


def cors_origins(value: str | None) -> tuple[str, ...] | None:
    """--cors-origins, comma-separated, without trailing slashes; None (not given): the default policy."""
    if value is None:
        return None
    return tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())


def tool_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--tools, --tools-runtime, --ui-mcp-proxy, and --agent (the first and the last at once)."""
    asked = "all" if args.agent else args.tools
    try:
        tools = parse_tool_names(asked) if asked is not None else ()
        if args.tools_runtime:
            Runtime.parse(args.tools_runtime)
    except (ValueError, BadContext) as exc:
        parser.error(str(exc))
    return {"tools": tools, "ui_mcp_proxy": args.ui_mcp_proxy or args.agent}


def api_prefix(parser: argparse.ArgumentParser, prefix: str) -> str:
    """`/llm`, `llm/` and `/llm/` all mean /llm; "/" or "" none."""
    cleaned = "/" + prefix.strip("/") if prefix.strip("/") else ""
    if any(c in cleaned for c in "?#% ") or "//" in cleaned:
        parser.error(f"--api-prefix must be a plain path like /llm, got {prefix!r}")
    return cleaned


def default_constraint(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--grammar/--grammar-file or -j/-jf (at most one): the constraint of requests without their own."""
    given = [f for f, v in (("--grammar", args.grammar), ("--grammar-file", args.grammar_file),
             ("-j", args.json_schema), ("-jf", args.json_schema_file)) if v is not None]  # fmt: skip
    if len(given) > 1:
        parser.error(f"{' and '.join(given)}: give one default constraint")
    if args.grammar_file is not None:
        return {"grammar": _read(parser, "--grammar-file", args.grammar_file)}
    schema_text = args.json_schema
    if args.json_schema_file is not None:
        schema_text = _read(parser, "-jf", args.json_schema_file)
    if schema_text is None:
        return {"grammar": args.grammar}
    schema = json_object(parser, given[0], schema_text)
    try:
        return {"json_schema": check_schema(schema)}
    except ValueError as exc:
        parser.error(f"{given[0]}: {exc}")


def _read(parser: argparse.ArgumentParser, flag: str, path: str) -> str:
    """The text of the file a flag names; one it cannot read exits 2."""
    try:
        return Path(path).read_text()
    except OSError as exc:
        parser.error(f"cannot read {flag}: {exc}")


def json_object(parser: argparse.ArgumentParser, flag: str, text: str | None) -> dict[str, Any]:
    """A flag's JSON object ({} when not given); anything else exits 2."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        parser.error(f"{flag} must be a JSON object: {exc}")
    if not isinstance(value, dict):
        parser.error(f"{flag} must be a JSON object, got {text!r}")
    return value


def ui_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--ui-config JSON or --ui-config-file PATH (the later one on the command line wins, as in
    llama-server, where both set one value; here the file when both are given): the web UI's defaults,
    served as /props' ui_settings. Not a JSON object, or a file that cannot be read, exits 2."""
    if args.ui_config_file is not None:
        try:
            text = Path(args.ui_config_file).read_text(encoding="utf-8")
        except OSError as exc:
            parser.error(f"--ui-config-file: cannot read {args.ui_config_file}: {exc.strerror or exc}")
        return json_object(parser, "--ui-config-file", text)
    return json_object(parser, "--ui-config", args.ui_config)


def stream_journal(parser: argparse.ArgumentParser, value: str | None) -> Path | None:
    """--stream-journal DIR: created if missing; a file, or a folder this process cannot write in,
    exits 2 naming it."""
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        parser.error(f"--stream-journal: {value} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # writable (root ignores mode bits, not a read-only mount)
            pass
    except OSError as exc:
        parser.error(f"--stream-journal: cannot write in {value}: {exc.strerror or exc}")
    return path


def spec_params(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SpecParams:
    """--spec-type (comma lists and repeats; `none` clears) and the draft flags; -md alone means
    draft-simple, as in llama-server."""
    types = [t.strip() for v in args.spec_type or () for t in v.split(",") if t.strip()]
    types = [] if "none" in types else types
    unknown = [t for t in types if t not in SPEC_TYPES]
    if unknown:
        parser.error(f"--spec-type {unknown[0]!r} is not supported (known: none, {', '.join(SPEC_TYPES)})")
    if args.model_draft and not args.spec_type:
        types = ["draft-simple"]
    if "draft-simple" in types and not args.model_draft:
        parser.error("--spec-type draft-simple needs a draft model: -md/--model-draft FILE")
    try:
        return SpecParams(
            tuple(dict.fromkeys(types)),
            n_max=args.draft_max,
            n_min=args.draft_min,
            p_min=args.draft_p_min,
            ngram_n=args.spec_ngram_size_n,
            ngram_m=args.spec_ngram_size_m,
            min_hits=args.spec_ngram_min_hits,
        )
    except ValueError as exc:
        parser.error(str(exc))


def sampling_params(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SamplingParams:
    """The sampling flags as SamplingParams; a bad value exits 2 naming it."""
    try:
        samplers = parse_samplers(args.samplers.split(";")) if args.samplers else None
        if args.sampler_seq:
            samplers = parse_samplers(args.sampler_seq)
        return SamplingParams(
            temperature=max(args.temp, 0.0),  # llama-server clamps a negative --temp to 0
            **{name: getattr(args, name) for name in NUMBER_FIELDS if name != "temperature"},
            dry_sequence_breakers=_breaker_flags(args.dry_sequence_breaker),
            logit_bias=_logit_bias_flags(args.logit_bias or []),
            **({"samplers": samplers} if samplers is not None else {}),
        )
    except ValueError as exc:
        parser.error(f"sampling: {exc}")


def _breaker_flags(values: list[str] | None) -> tuple[str, ...]:
    """--dry-sequence-breaker: given ones replace the defaults; "none" leaves no breakers at all."""
    if values is None:
        return SamplingParams().dry_sequence_breakers
    return () if "none" in values else tuple(values)


def _logit_bias_flags(values: list[str]) -> dict[int, float]:
    """llama-server's -l TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 15043-inf."""
    bias: dict[int, float] = {}
    for value in values:
        match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", value)
        try:
            amount = float(match.group(3)) if match else math.nan
        except ValueError:
            amount = math.nan
        if match is None or math.isnan(amount):
            raise ValueError(f"--logit-bias {value!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1")
        token = int(match.group(1))
        bias[token] = bias.get(token, 0.0) + (-amount if match.group(2) == "-" else amount)
    return bias


def cache_models(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """-hf (with -hff) and -hfd as the model and draft files of llama.cpp's cache, offline; the model's
    API name is -hf's, as llama-server names it, unless -a gives one. Not in the cache: exit 2. -hfd is
    set as `args.model_draft` too: the speculation flags read it (-md alone means draft-simple)."""
    if args.hf_file and not args.hf_repo:
        parser.error("--hf-file needs -hf/--hf-repo (the repository it is a file of)")
    values: dict[str, Any] = {}
    if args.hf_repo:
        if args.model:
            parser.error(f"-hf {args.hf_repo} and -m {args.model} both name the model")
        values["model"] = _cached(parser, "-hf", args.hf_repo, args.hf_file)
        values["alias"] = args.alias or args.hf_repo
    if args.hf_repo_draft:
        if args.model_draft:
            parser.error(f"-hfd {args.hf_repo_draft} and -md {args.model_draft} both name the draft model")
        values["model_draft"] = args.model_draft = _cached(parser, "-hfd", args.hf_repo_draft, None)
    return values


def _cached(parser: argparse.ArgumentParser, flag: str, name: str, file: str | None) -> str:
    try:
        path = hf_cache.resolve(name, file)
    except hf_cache.CacheNameError as exc:
        parser.error(f"{flag}: {exc}")
    if path is None:
        what = f"{name} ({file})" if file else name
        parser.error(
            f"{flag} {what} is not in llama.cpp's cache {hf_cache.cache_dir()} (LLAMA_CACHE);"
            " Llamba downloads nothing from a model hub"
        )
    return str(path)


def lora_adapters(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, str], ...]]:
    """--lora FNAME[,FNAME...] (scale 1) and --lora-scaled FNAME:SCALE[,...], as llama-server's
    common/arg.cpp reads them (CSV items, in command-line order: an adapter's id is its place);
    --lora-init-without-apply sets every scale to 0. Then the named adapters (adapters as models):
    --lora NAME=FILE items and vLLM's --lora-modules NAME=FILE or {"name": ..., "path": ...}, as (name,
    path) pairs (their ids follow the others')."""
    adapters: list[tuple[str, float]] = []
    named: list[tuple[str, str]] = []
    for kind, value in args.lora_items:
        if kind:
            adapters += scaled_items(parser, "--lora-scaled", value)
            continue
        for item in _csv_row(value):
            if _named_item(item):
                name, _, path = item.partition("=")
                named.append((name, path))
            elif item:
                adapters.append((item, 1.0))
    named += [_lora_module(parser, value) for value in args.lora_modules]
    if args.lora_init_without_apply:
        adapters = [(path, 0.0) for path, _ in adapters]
    names = [name for name, _ in named]
    for name in names:
        if names.count(name) > 1:
            parser.error(f"--lora: the adapter name {name!r} is given twice")
    return tuple(adapters), tuple(named)


def control_vectors(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[tuple[str, float], ...]:
    """--control-vector FNAME[,...] (scale 1) and --control-vector-scaled FNAME:SCALE[,...], as arg.cpp
    reads them, in command-line order (they are summed)."""
    out: list[tuple[str, float]] = []
    for kind, value in args.control_vector_items:
        if kind:
            out += scaled_items(parser, "--control-vector-scaled", value)
        else:
            out += [(item, 1.0) for item in _csv_row(value) if item]
    return tuple(out)


def _named_item(item: str) -> bool:
    """NAME=FILE: a name before '=' with no path separator in it (a file path with '=' stays a path)."""
    name, eq, path = item.partition("=")
    return bool(eq and name and path) and "/" not in name and not Path(item).exists()


def _lora_module(parser: argparse.ArgumentParser, value: str) -> tuple[str, str]:
    """One of vLLM's --lora-modules items: name=path, or {"name": ..., "path": ...}."""
    if value.lstrip().startswith("{"):
        try:
            module = json.loads(value)
            return str(module["name"]), str(module["path"])
        except (ValueError, KeyError, TypeError):
            parser.error(f"--lora-modules: {value!r}: expected JSON with 'name' and 'path'")
    name, eq, path = value.partition("=")
    if not (eq and name and path):
        parser.error(f"--lora-modules: {value!r}: expected NAME=PATH")
    return name, path


def scaled_items(parser: argparse.ArgumentParser, flag: str, value: str) -> list[tuple[str, float]]:
    """--lora-scaled / --control-vector-scaled items: FNAME:SCALE, comma-separated (arg.cpp's split)."""
    out: list[tuple[str, float]] = []
    for item in _csv_row(value):
        parts = item.split(":")
        if len(parts) != 2:
            parser.error(f"{flag}: {item!r}: {flag[2:]} format: FNAME:SCALE")
        try:
            out.append((parts[0], float(parts[1])))
        except ValueError:
            parser.error(f"{flag}: {item!r}: the scale is not a number")
    return out


def _csv_row(value: str) -> list[str]:
    return next(csv.reader([value]), [])
