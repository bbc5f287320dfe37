"""MCP server configuration, Cursor / Claude Desktop style: `{"mcpServers": {name: {...}}}`.

A server is either a process Llamba starts (`command`, `args`, `env`, `cwd`: stdio) or a remote one
(`url`, `headers`: Streamable HTTP, or HTTP+SSE with `"type": "sse"` or a URL ending in `/sse`).
Both take `timeout_ms` (each request) and `restart_cooldown_ms` (the first back-off of a server that keeps
crashing, doubled at each quick crash after it: server/mcp/manager.py's `restart_delay`; one crash is
restarted at once); a remote one also `connect_timeout_ms` (connecting and the MCP handshake). `${NAME}` in a
header value is the environment variable NAME, so a token need not be written into the file.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

Transport = Literal["stdio", "streamable-http", "sse"]
# The names configs in the wild give the transport in their "type" field.
TRANSPORT_NAMES: dict[str, Transport] = {
    "stdio": "stdio",
    "http": "streamable-http",
    "streamable-http": "streamable-http",
    "streamable_http": "streamable-http",
    "streamableHttp": "streamable-http",
    "sse": "sse",
}
_ENV_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
STDIO_COOLDOWN_MS = 5_000


class McpConfigError(ValueError):
    """The configuration cannot be used; the server must refuse to start."""


def url_transport(url: str) -> Transport:
    """The transport a URL without an explicit type is spoken to with: HTTP+SSE for a path ending in
    `/sse` (the convention of SSE servers), Streamable HTTP otherwise."""
    return "sse" if urlsplit(url).path.rstrip("/").endswith("/sse") else "streamable-http"


class McpServerConfig(BaseModel):
    # Unknown keys are ignored: Cursor / Claude Desktop configs carry fields of their own.
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1)
    transport: Transport = "stdio"
    command: str | None = Field(default=None, min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict, repr=False)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict, repr=False)  # values are secrets: never shown
    timeout_ms: int = Field(default=30_000, gt=0)
    connect_timeout_ms: int = Field(default=10_000, gt=0)
    # Llamba extension: the least time between two spawns of this server, so a crash loop cannot spin
    # (a remote server: between two connections; by default it is reconnected at once).
    restart_cooldown_ms: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _one_kind(self) -> McpServerConfig:
        if self.transport == "stdio":
            if self.command is None:
                raise ValueError("give a 'command' (a stdio server) or a 'url' (a remote one)")
            if self.url is not None or self.headers:
                raise ValueError("'url' and 'headers' are for remote servers; this one has a 'command'")
            return self
        if self.url is None:
            raise ValueError(f"a {self.transport} server needs a 'url'")
        if self.command is not None or self.args or self.env or self.cwd is not None:
            raise ValueError("'command', 'args', 'env' and 'cwd' are for stdio servers; this one has a 'url'")
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"'url' must be an http:// or https:// URL, got {self.url!r}")
        return self

    @property
    def remote(self) -> bool:
        return self.transport != "stdio"

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def connect_timeout_s(self) -> float:
        return self.connect_timeout_ms / 1000

    @property
    def start_timeout_s(self) -> float:
        """Starting (connecting) and the handshake: a remote server's connect timeout comes first."""
        return self.timeout_s + (self.connect_timeout_s if self.remote else 0.0)

    @property
    def restart_cooldown_s(self) -> float:
        cooldown = self.restart_cooldown_ms
        return (cooldown if cooldown is not None else 0 if self.remote else STDIO_COOLDOWN_MS) / 1000


def load_mcp_servers(config_path: str | Path | None, config_json: str | None) -> tuple[McpServerConfig, ...]:
    """Servers from a file and/or an inline JSON string (file first). Any defect raises McpConfigError."""
    servers: dict[str, McpServerConfig] = {}
    sources: list[tuple[str, str]] = []
    if config_path is not None:
        try:
            sources.append((f"--mcp-servers-config {config_path}", Path(config_path).read_text("utf-8")))
        except (OSError, UnicodeDecodeError) as exc:
            raise McpConfigError(f"cannot read --mcp-servers-config {config_path}: {exc}") from exc
    if config_json is not None:
        sources.append(("--mcp-servers-json", config_json))
    for where, text in sources:
        for server in parse_mcp_servers(text, where):
            if server.name in servers:
                raise McpConfigError(f"{where}: MCP server '{server.name}' is defined twice")
            servers[server.name] = server
    return tuple(servers.values())


def parse_mcp_servers(text: str, where: str = "MCP config") -> list[McpServerConfig]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise McpConfigError(f"{where}: invalid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("mcpServers"), dict):
        raise McpConfigError(
            f'{where}: expected an object {{"mcpServers": {{"<name>": {{"command": ...}}}}}}'
        )
    return [_one_server(name, entry, where) for name, entry in doc["mcpServers"].items()]


def _one_server(name: str, entry: Any, where: str) -> McpServerConfig:
    if not isinstance(entry, dict):
        raise McpConfigError(f"{where}: mcpServers.{name} must be an object")
    fields = {**entry, "name": name}
    kind = fields.pop("type", None)
    if kind is not None and kind not in TRANSPORT_NAMES:
        known = ", ".join(TRANSPORT_NAMES)
        raise McpConfigError(f"{where}: mcpServers.{name}.type: {kind!r} is not a transport ({known})")
    if isinstance(fields.get("url"), str):
        fields["transport"] = TRANSPORT_NAMES[kind] if kind is not None else url_transport(fields["url"])
    elif kind is not None:
        fields["transport"] = TRANSPORT_NAMES[kind]
    try:
        if isinstance(fields.get("headers"), dict):
            fields["headers"] = {k: _expand(v, f"headers.{k}") for k, v in fields["headers"].items()}
        return McpServerConfig.model_validate(fields, strict=False)
    except McpConfigError as exc:
        raise McpConfigError(f"{where}: mcpServers.{name}.{exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        place = f"mcpServers.{name}.{field}" if field else f"mcpServers.{name}"
        raise McpConfigError(f"{where}: {place}: {err['msg'].removeprefix('Value error, ')}") from exc


def _expand(value: Any, where: str) -> Any:
    """`${NAME}` in a header value: the environment variable (a missing one is a config error)."""
    if not isinstance(value, str):
        return value

    def variable(match: re.Match[str]) -> str:
        if match[1] not in os.environ:
            raise McpConfigError(f"{where}: the environment variable {match[1]} is not set")
        return os.environ[match[1]]

    return _ENV_REFERENCE.sub(variable, value)
