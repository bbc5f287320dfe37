"""Request fields for structured output and tool calls (pydantic): OpenAI's shapes and llama-server's.

- `grammar` (llama.cpp's GBNF) and `json_schema` (llama-server's fields), `response_format`
  (`{"type": "text" | "json_object" | "json_schema"}`, with llama-server's `{"type": "json_object",
  "schema": ...}` too): at most one of them constrains a request.
- `tools` (function tools: a name, a description, a JSON schema of the arguments; and MCP servers the
  server runs itself, configured or named by URL, in the Responses API's `mcp` shape:
  server/agents/loop.py), `tool_choice` (`none`,
  `auto`, `required` or a named function) and `parallel_tool_calls`.

Every schema a client sends is checked against JSON Schema's meta-schema here (with
`server/config/json_schema.py`'s check), so a broken one is a 400 naming its field before anything runs.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from server.config.json_schema import check_schema

TOOL_NAME = r"^[a-zA-Z0-9_.:-]{1,128}$"


class FunctionDefinition(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # true: `parameters` means what JSON Schema says (model/llama_schema.py)

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_schema(v)


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    function: FunctionDefinition


class AllowedTools(BaseModel):
    """The Responses API's filter form of `allowed_tools`."""

    model_config = ConfigDict(extra="forbid")

    tool_names: list[str] | None = None
    read_only: bool | None = None  # True: only the tools the MCP server marks read-only


# Headers a client may not set on a request the server makes for it: HTTP's own framing and routing, and
# the ones the MCP transports manage themselves.
RESERVED_HEADERS = frozenset({
    "host", "content-length", "transfer-encoding", "connection", "keep-alive", "upgrade", "te", "trailer",
    "proxy-authorization", "proxy-connection", "mcp-session-id", "mcp-protocol-version", "last-event-id",
})  # fmt: skip
HEADER_NAME = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"


class ApprovalFilter(BaseModel):
    """The Responses API's filter form of `require_approval`: which tools always, or never, need it."""

    model_config = ConfigDict(extra="forbid")

    always: AllowedTools | None = None
    never: AllowedTools | None = None


class McpServerTool(BaseModel):
    """An MCP server offered to the model and run by Llamba (the Responses API's `mcp` tool): a configured
    one by its `server_label` (server_url, if given, is its name or `mcp://<name>`), or a remote one the
    request names by `server_url`, with its `headers` (or `authorization`, a bearer token), when
    --mcp-allow-hosts admits its host (server/agents/loop.py). `require_approval`: a configured server's
    calls run as the model makes them unless it says otherwise; a request-named server's need the
    client's approval unless it is "never" (OpenAI's default), which only the Responses API can ask for.
    Anything else OpenAI's tool has (connector_id, ...) is refused as an unknown field, not ignored."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["mcp"]
    server_label: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    server_url: str | None = None
    server_description: str | None = None  # shown to the model before each of the server's tools'
    headers: dict[str, str] | None = Field(default=None, repr=False)
    authorization: str | None = Field(default=None, repr=False)
    allowed_tools: list[str] | AllowedTools | None = None
    require_approval: Literal["always", "never"] | ApprovalFilter | None = None

    @field_validator("headers")
    @classmethod
    def _sendable_headers(cls, v: dict[str, str] | None) -> dict[str, str] | None:
        for name, value in (v or {}).items():
            if not re.match(HEADER_NAME, name) or name.lower() in RESERVED_HEADERS:
                raise ValueError(f"{name!r} cannot be sent (not a header name, or one the server sets)")
            if any(c in value for c in "\r\n\0"):
                raise ValueError(f"the value of {name!r} has a line break or a NUL")
        return v

    def is_remote(self) -> bool:
        """Whether the request names the server by a URL (not a configured server)."""
        url = self.server_url
        return url is not None and url not in (self.server_label, f"mcp://{self.server_label}")

    def request_headers(self) -> dict[str, str]:
        """The headers of a request-named server: `headers`, and `authorization` as a bearer token."""
        headers = dict(self.headers or {})
        if self.authorization is not None:
            headers["Authorization"] = f"Bearer {self.authorization}"
        return headers

    def tool_filter(self) -> tuple[set[str] | None, bool]:
        """(the tool names allowed, None for all; read-only tools only)."""
        allowed = self.allowed_tools
        if isinstance(allowed, AllowedTools):
            names = None if allowed.tool_names is None else set(allowed.tool_names)
            return names, bool(allowed.read_only)
        return (None if allowed is None else set(allowed)), False

    def needs_approval(self, tool: str, read_only: bool) -> bool:
        """Whether a call of `tool` (the server's own name for it) waits for the client's approval."""
        rule = self.require_approval
        if rule is None:
            return self.is_remote()
        if isinstance(rule, str):
            return rule == "always"
        if rule.never is not None and _matches(rule.never, tool, read_only):
            return False
        if rule.always is not None:
            return _matches(rule.always, tool, read_only)
        return self.is_remote()


def without_secrets(body: Any) -> Any:
    """A request body without the secrets of the MCP servers it names (an `mcp` tool's headers and
    authorization, an Anthropic `mcp_servers` entry's authorization_token), for anything kept on disk."""
    if not isinstance(body, dict):
        return body
    kept = dict(body)
    if isinstance(body.get("tools"), list):
        kept["tools"] = [
            {k: v for k, v in t.items() if k not in ("headers", "authorization")}
            if isinstance(t, dict) and t.get("type") == "mcp"
            else t
            for t in body["tools"]
        ]
    if isinstance(body.get("mcp_servers"), list):
        kept["mcp_servers"] = [
            {k: v for k, v in s.items() if k != "authorization_token"} if isinstance(s, dict) else s
            for s in body["mcp_servers"]
        ]
    return kept


def _matches(spec: AllowedTools, tool: str, read_only: bool) -> bool:
    named = spec.tool_names is None or tool in spec.tool_names
    return named and (not spec.read_only or read_only)


Tool = Annotated[FunctionTool | McpServerTool, Field(discriminator="type")]


class NamedFunction(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoiceField = Literal["none", "auto", "required"] | NamedToolChoice


class JsonSchemaFormat(BaseModel):
    """OpenAI's response_format.json_schema."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_schema(v)


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None  # OpenAI: with type json_schema
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama-server: with json_object

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_schema(v)

    @model_validator(mode="after")
    def _schema_where_it_belongs(self) -> ResponseFormat:
        if self.type == "json_schema" and (self.json_schema is None or self.json_schema.schema_ is None):
            raise ValueError('type "json_schema" needs json_schema.schema')
        if self.type == "text" and (self.json_schema is not None or self.schema_ is not None):
            raise ValueError('type "text" takes no schema')
        return self

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must follow; {} for any JSON object; None for free text."""
        if self.type == "json_schema":
            return self.json_schema.schema_ if self.json_schema else None
        if self.type == "json_object":
            return self.schema_ if self.schema_ is not None else {"type": "object"}
        return None


class ConstraintFields(BaseModel):
    """What constrains the output, on every generation route."""

    grammar: str | None = None
    # llama-server's lazy grammar: free output until a trigger, then `grammar` from the trigger on.
    grammar_lazy: bool = False
    grammar_triggers: list[dict[str, Any]] | None = None
    json_schema: dict[str, Any] | None = None
    response_format: ResponseFormat | None = None

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_schema(v)

    @model_validator(mode="after")
    def _one_constraint(self) -> ConstraintFields:
        named = [n for n in ("grammar", "json_schema") if getattr(self, n)]
        if self.response_format is not None and self.response_format.type != "text":
            named.append("response_format")
        if len(named) > 1:
            raise ValueError(f"{' and '.join(named)} cannot be used together: give one constraint")
        if self.grammar_lazy and (self.grammar is None or not self.grammar_triggers):
            raise ValueError("grammar_lazy needs a grammar and grammar_triggers")
        return self

    def answer_schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must follow, from json_schema or response_format."""
        if self.json_schema is not None:
            return self.json_schema
        return self.response_format.schema() if self.response_format is not None else None

    def answer_strict(self) -> bool:
        """OpenAI's `"strict": true` on response_format's json_schema: the schema keeps OpenAI's meaning
        (server/model/llama_schema.py); every other schema means what it means to llama-server."""
        fmt = self.response_format
        strict = fmt is not None and fmt.type == "json_schema" and fmt.json_schema is not None
        return self.json_schema is None and strict and fmt.json_schema.strict is True  # type: ignore[union-attr]


class ToolFields(BaseModel):
    """Chat's tool fields."""

    tools: list[Tool] | None = None
    tool_choice: ToolChoiceField | None = None
    # None: llama-server's default, the template's own (whether it renders parallel calls)
    parallel_tool_calls: bool | None = None
    # The server-side tool loop's per-request limits (only with `mcp` tools; server/agents/loop.py).
    max_tool_rounds: int | None = Field(default=None, ge=1)
    tool_timeout: float | None = Field(default=None, gt=0)  # seconds, each MCP call
    # Llamba's: the tools that write or run commands (GET /tools' permissions.write) the user approved;
    # given, a call of any other such tool pauses the loop before it (finish_reason tool_calls with
    # `pending_approval`; server/agents/loop.py). The web UI fills it. None: every offered tool runs.
    approved_tools: list[str] | None = None
    # Set by Llamba's own tool loop, never read from a body: its tools stay described in the prompt, even
    # under tool_choice auto on a template without tool support (server/agents/loop.py says why).
    _keep_tools: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _choice_matches_tools(self) -> ToolFields:
        names = [t.function.name for t in self.function_tools()]
        if len(set(names)) != len(names):
            raise ValueError("tools: two tools have the same name")
        labels = [t.server_label for t in self.mcp_tools()]
        if len(set(labels)) != len(labels):
            raise ValueError("tools: two mcp tools name the same server_label")
        choice = self.tool_choice
        # A named choice may name an MCP server's tool: server/agents/loop.py checks it once they are known.
        if isinstance(choice, NamedToolChoice) and choice.function.name not in names and not labels:
            raise ValueError(f"tool_choice names {choice.function.name!r}, which is not among the tools")
        if choice == "required" and not names and not labels:
            raise ValueError('tool_choice "required" needs tools')
        limits = (self.max_tool_rounds, self.tool_timeout, self.approved_tools)
        if not labels and any(v is not None for v in limits):
            raise ValueError(
                "max_tool_rounds, tool_timeout and approved_tools apply to mcp tools only: "
                "the request has none"
            )
        return self

    def function_tools(self) -> list[FunctionTool]:
        return [t for t in self.tools or () if isinstance(t, FunctionTool)]

    def mcp_tools(self) -> list[McpServerTool]:
        return [t for t in self.tools or () if isinstance(t, McpServerTool)]

    def tool_dicts(self) -> list[dict[str, Any]]:
        """The function tools as the chat template and the tool-call formats take them (MCP servers
        reach the model as function tools too, once server/agents/loop.py has listed them)."""
        return [t.model_dump(exclude_none=True) for t in self.function_tools()]

    def tool_choice_value(self) -> Any:
        choice = self.tool_choice
        return choice.model_dump() if isinstance(choice, NamedToolChoice) else choice
