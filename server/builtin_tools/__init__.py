"""llama-server's built-in tools (`--tools`): files, search and shell, in a working directory
(confined to it without the shell tool)."""

from server.builtin_tools.catalog import BUILTIN_LABEL, NAMES, BuiltinTool, BuiltinTools, parse_tool_names
from server.builtin_tools.context import ToolContext
from server.builtin_tools.runtime import Runtime
from server.builtin_tools.workdir import BadContext, ToolError, Workdir

__all__ = [
    "BUILTIN_LABEL",
    "NAMES",
    "BadContext",
    "BuiltinTool",
    "BuiltinTools",
    "Runtime",
    "ToolContext",
    "ToolError",
    "Workdir",
    "parse_tool_names",
]
