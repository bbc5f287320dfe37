"""MCP (Model Context Protocol) servers over stdio: config, JSON-RPC, transport, tool registry, manager."""

from server.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers
from server.mcp.manager import McpManager, ToolResult
from server.mcp.registry import McpTool

__all__ = ["McpConfigError", "McpManager", "McpServerConfig", "McpTool", "ToolResult", "load_mcp_servers"]
