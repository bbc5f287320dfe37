"""llama-server's environment variables (`LLAMA_ARG_*`, and `LLAMA_API_KEY`) as command-line arguments.

Every row of `server/config/llama_server_flags.py` that names a variable is read as llama-server reads it
(common/arg.cpp): a value flag takes the variable's value; a switch is set by a truthy value (on,
enabled, true, 1) and, when it has a negative form, cleared by a falsey one (off, disabled, false, 0) or
by the variable's `LLAMA_ARG_NO_*` twin. The command line wins: a variable whose flag is also given
there is not read (and is reported). The arguments a variable stands for then go through the command
line's own path, so an ignored flag set by its variable warns, naming the variable.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from server.config.llama_server_flags import FLAGS, LlamaServerFlag

TRUTHY = ("on", "enabled", "true", "1")
FALSEY = ("off", "disabled", "false", "0")

F = LlamaServerFlag
# Llamba's own flags and older llama-server variable names that launch scripts still set: read the same
# way. `LLAMA_ARG_API_KEY` is also how a router hands its children their secret key.
LLAMBA_ENV: tuple[LlamaServerFlag, ...] = (
    F(("--api-key",), "KEY", "LLAMA_ARG_API_KEY", "implemented"),
    F(("--mlock",), "", "LLAMA_ARG_MLOCK", "implemented"),
    F(("-md", "--model-draft", "--spec-draft-model"), "FNAME", "LLAMA_ARG_MODEL_DRAFT", "implemented"),
    F(("--draft-p-min", "--spec-draft-p-min"), "P", "LLAMA_ARG_DRAFT_P_MIN", "implemented"),
    F(("--keep",), "N", "LLAMA_ARG_KEEP", "implemented"),
    F(("--slot-save-path",), "PATH", "LLAMA_ARG_SLOT_SAVE_PATH", "implemented"),
    F(("--sleep-idle-seconds",), "SECONDS", "LLAMA_ARG_SLEEP_IDLE_SECONDS", "implemented"),
    F(("--stream-buffer-size",), "N", "LLAMA_ARG_STREAM_BUFFER_SIZE", "implemented"),
    F(("--stream-ttl",), "N", "LLAMA_ARG_STREAM_TTL", "implemented"),
    F(("--stream-max-sessions",), "N", "LLAMA_ARG_STREAM_MAX_SESSIONS", "implemented"),
    F(("--shutdown-timeout",), "SECONDS", "LLAMA_ARG_SHUTDOWN_TIMEOUT", "implemented"),
    F(("--stream-max-sessions-per-client",), "N", "LLAMA_ARG_STREAM_MAX_SESSIONS_PER_CLIENT", "implemented"),
    F(("--stream-journal",), "DIR", "LLAMA_ARG_STREAM_JOURNAL", "implemented"),
    F(("--tool-max-rounds",), "N", "LLAMA_ARG_TOOL_MAX_ROUNDS", "implemented"),
    F(("--tool-timeout",), "N", "LLAMA_ARG_TOOL_TIMEOUT", "implemented"),
    F(("--tool-max-tokens",), "N", "LLAMA_ARG_TOOL_MAX_TOKENS", "implemented"),
    F(("--mcp-allow-hosts",), "PATTERNS", "LLAMA_ARG_MCP_ALLOW_HOSTS", "implemented"),
    F(("--tools-regex-timeout",), "SECONDS", "LLAMA_ARG_TOOLS_REGEX_TIMEOUT", "implemented"),
)


class EnvError(ValueError):
    """A variable whose value its flag cannot take (a switch set to neither a truthy nor a falsey word)."""


@dataclass(frozen=True)
class EnvArg:
    """One variable read: its name and the command-line arguments it stands for."""

    env: str
    args: tuple[str, ...]


@dataclass(frozen=True)
class EnvArgs:
    read: tuple[EnvArg, ...]
    overridden: tuple[tuple[str, str], ...]  # (variable, the command-line flag that wins over it)


def split_switch(forms: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A switch row's positive and negative forms (`--ui, --webui, --no-ui, --no-webui`; `-nr`): the
    negatives are the forms spelled with a leading `n`/`no-`, unless every form is (`--no-host`)."""
    negative = tuple(f for f in forms if f.lstrip("-").startswith("n"))
    if len(negative) == len(forms):
        return tuple(forms), ()
    return tuple(f for f in forms if f not in negative), negative


def env_rows() -> dict[str, list[LlamaServerFlag]]:
    """Every variable and the rows it sets (a split row, `--prefill-assistant`, shares one)."""
    rows: dict[str, list[LlamaServerFlag]] = {}
    for flag in (*FLAGS, *LLAMBA_ENV):
        if flag.env:
            rows.setdefault(flag.env, []).append(flag)
    return rows


def env_arguments(environ: Mapping[str, str], argv: Sequence[str]) -> EnvArgs:
    """The variables set in `environ` as arguments, minus those whose flag `argv` gives itself."""
    given = {arg.split("=", 1)[0] for arg in argv if arg.startswith("-")}
    read: list[EnvArg] = []
    overridden: list[tuple[str, str]] = []
    for env, rows in env_rows().items():
        value, name = _value(environ, env, rows)
        if value is None:
            continue
        winner = next((form for row in rows for form in row.forms if form in given), None)
        if winner is not None:
            overridden.append((name, winner))
            continue
        args = _arguments(name, value, rows)
        if args:
            read.append(EnvArg(name, args))
    return EnvArgs(tuple(read), tuple(overridden))


def _value(environ: Mapping[str, str], env: str, rows: list[LlamaServerFlag]) -> tuple[str | None, str]:
    """The variable's value, or "0" when its `LLAMA_ARG_NO_*` twin is set (a switch with a negative form)."""
    if _switch_forms(rows)[1]:
        twin = env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1)
        if twin != env and twin in environ:
            return "0", twin
    return environ.get(env), env


def _switch_forms(rows: list[LlamaServerFlag]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A switch's positive and negative forms (none for a value flag); split rows share a variable."""
    if rows[0].value:
        return (), ()
    if len(rows) > 1:
        return rows[0].forms, tuple(f for row in rows[1:] for f in row.forms)
    return split_switch(rows[0].forms)


def _arguments(name: str, value: str, rows: list[LlamaServerFlag]) -> tuple[str, ...]:
    row = rows[0]
    if row.value:  # `--flag=value`: a value that starts with '-' stays a value
        long = next((f for f in row.forms if f.startswith("--")), row.forms[0])
        return (f"{long}={value}",)
    positive, negative = _switch_forms(rows)
    if value.lower() in TRUTHY:
        return (positive[0],)
    if value.lower() in FALSEY:
        return (negative[0],) if negative else ()
    words = ", ".join(TRUTHY + FALSEY)
    raise EnvError(f"{name}={value!r}: {row.forms[-1]} is a switch: expected one of {words}")
