"""MCP server configuration: Cursor-style `{"mcpServers": {name: {command, args, env, cwd, timeout_ms}}}`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class McpConfigError(ValueError):
    """The configuration cannot be used; the server must refuse to start."""


class McpServerConfig(BaseModel):
    # Unknown keys are ignored: Cursor / Claude Desktop configs carry fields of their own ("type", ...).
    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str = Field(min_length=1)
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    timeout_ms: int = Field(default=30_000, gt=0)
    # Llamba extension: the least time between two spawns of this server, so a crash loop cannot spin.
    restart_cooldown_ms: int = Field(default=5_000, ge=0)

    @property
    def timeout_s(self) -> float:
        return self.timeout_ms / 1000

    @property
    def restart_cooldown_s(self) -> float:
        return self.restart_cooldown_ms / 1000


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
    if "command" not in entry and "url" in entry:
        raise McpConfigError(
            f"{where}: mcpServers.{name}: only stdio servers (with a 'command') are supported"
        )
    try:
        return McpServerConfig.model_validate({**entry, "name": name}, strict=False)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise McpConfigError(f"{where}: mcpServers.{name}.{field}: {err['msg']}") from exc
