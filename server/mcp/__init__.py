"""MCP (Model Context Protocol) servers: config, the stdio process and its JSON-RPC, remote servers
through the `mcp` SDK, the egress policy of client-named servers, the tool registry, the manager."""

from server.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers
from server.mcp.egress import HostPolicy, HostRefused
from server.mcp.manager import MCP_FAILURES, McpManager, ToolResult
from server.mcp.registry import McpTool

__all__ = [
    "MCP_FAILURES",
    "HostPolicy",
    "HostRefused",
    "McpConfigError",
    "McpManager",
    "McpServerConfig",
    "McpTool",
    "ToolResult",
    "load_mcp_servers",
]
