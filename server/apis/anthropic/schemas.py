"""Anthropic's Messages API request bodies (pydantic), and their translation into a chat request.

`/v1/messages` and `/v1/messages/count_tokens` validate here (a 400 naming the field, in Anthropic's
error shape), then `to_chat` turns the body into the `ChatCompletionRequest` the one generation path
takes: `system` first, text blocks as content, `tool_use` blocks as the assistant's tool calls,
`tool_result` blocks as tool messages, `thinking` blocks as reasoning, the MCP connector's
`mcp_tool_use` and `mcp_tool_result` blocks as a call and its result; tools, tool_choice,
stop_sequences, thinking and output_config onto their chat fields, and `mcp_servers` (the MCP connector)
as `mcp` tools, run by the server-side tool loop.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from server.chat.schemas import ChatCompletionRequest
from server.chat.tool_schemas import TOOL_NAME
from server.chat.unsupported import TELEMETRY, check_extras, passed_extras
from server.config.json_schema import check_schema
from server.http import errors

# Block types Anthropic defines that carry what this server cannot read or does not run.
REFUSED_BLOCKS = {
    "document": "document blocks are not supported: send the document's text in a text block",
    "search_result": "search_result blocks are not supported: send the result's text in a text block",
    "redacted_thinking": "redacted_thinking blocks are not supported: they hold Anthropic's encrypted "
    "reasoning, which no model here can read",
    "server_tool_use": "server_tool_use blocks are not supported: this server runs no server tools",
    "web_search_tool_result": "web_search_tool_result blocks are not supported: this server runs no "
    "server tools",
    "container_upload": "container_upload blocks are not supported: this server has no code containers",
}


# The chat fields `thinking` sets: with it, an extra field by these names would contradict it.
THINKING_FIELDS = frozenset({"chat_template_kwargs", "reasoning_budget_tokens"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Cached(Strict):
    """A block or tool that may carry `cache_control`: accepted, as prompt caching here is automatic
    (every prompt's prefix is reused by the slots and the host prompt cache)."""

    cache_control: dict[str, Any] | None = None


class TextBlock(Cached):
    type: Literal["text"]
    text: str
    citations: list[dict[str, Any]] | None = None

    @field_validator("citations")
    @classmethod
    def _no_citations(cls, v: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        if v:
            raise ValueError("citations are not supported")
        return v


class RefusedBlock(BaseModel):
    """A block type Anthropic defines that this server cannot take: a 400 saying why."""

    type: Literal[tuple(REFUSED_BLOCKS)]  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        raise ValueError(REFUSED_BLOCKS.get(str(kind), "unsupported block"))


class ImageBlock(Cached):
    """An image, as llama-server converts one: an `image_url` part of the user message (a base64 source
    as a data: URL); the model must read images (--mmproj), else the chat route's 400."""

    type: Literal["image"]
    source: dict[str, Any]

    def url(self) -> str:
        kind, source = self.source.get("type"), self.source
        if kind == "base64" and isinstance(source.get("data"), str):
            return f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
        if kind == "url" and isinstance(source.get("url"), str):
            return source["url"]
        raise errors.invalid_request(
            "an image block's source is {type: base64, media_type, data} or {type: url, url}"
        )


class ToolUseBlock(Cached):
    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(pattern=TOOL_NAME)
    input: dict[str, Any]
    # What Anthropic's replies carry (the SDK sends them back with the history): who made the call
    # (`{"type": "direct"}`, or a code-execution tool's) and the toolset of the tool. History only:
    # they change nothing the model reads (docs/compatibility.md).
    caller: dict[str, Any] | None = None
    toolset_name: str | None = None


class ToolResultBlock(Cached):
    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: str | list[Annotated[TextBlock | RefusedBlock, Field(discriminator="type")]] | None = None
    is_error: bool = False
    toolset_name: str | None = None  # as on tool_use: the tool's toolset, nothing the model reads

    def text(self) -> str:
        """The result as the tool message's text, as llama-server converts it: its text blocks joined
        with nothing between them, and is_error dropped (the model reads the content alone)."""
        if isinstance(self.content, list):
            return "".join(block.text for block in self.content if isinstance(block, TextBlock))
        return self.content or ""


class McpToolUseBlock(Strict):
    """An earlier answer's call of an MCP server's tool (the MCP connector's block, Llamba ran it)."""

    type: Literal["mcp_tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    server_name: str = Field(min_length=1)
    input: dict[str, Any]


class McpToolResultBlock(Strict):
    """That call's result, in the same assistant message."""

    type: Literal["mcp_tool_result"]
    tool_use_id: str = Field(min_length=1)
    is_error: bool = False
    content: str | list[TextBlock] | None = None

    def text(self) -> str:
        """As the model read it (an error as server/agents/loop.py words it)."""
        if isinstance(self.content, list):
            text = "\n".join(block.text for block in self.content)
        else:
            text = self.content or ""
        return f"Error: {text}" if self.is_error else text


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None  # Anthropic's integrity check of its own reasoning; Llamba's are ""


Block = Annotated[
    TextBlock
    | ImageBlock
    | ToolUseBlock
    | ToolResultBlock
    | ThinkingBlock
    | McpToolUseBlock
    | McpToolResultBlock
    | RefusedBlock,
    Field(discriminator="type"),
]


class Message(Strict):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(Cached):
    type: Literal["custom"] | None = None
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    input_schema: dict[str, Any]
    strict: bool | None = None  # true: input_schema means what JSON Schema says (model/llama_schema.py)
    # Accepted: inputs stream as they are generated anyway; examples are not shown to the model here
    # (docs/compatibility.md); the model calls tools directly (no code execution tool), all loaded.
    eager_input_streaming: bool | None = None
    input_examples: list[dict[str, Any]] | None = None
    allowed_callers: list[str] | None = None
    defer_loading: Literal[False] | None = None  # deferred tools need Anthropic's tool search

    @field_validator("allowed_callers")
    @classmethod
    def _called_directly(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and "direct" not in v:
            raise ValueError('allowed_callers must include "direct": this server runs no code execution tool')
        return v

    @model_validator(mode="before")
    @classmethod
    def _custom_tools_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind not in (None, "custom"):
            raise ValueError(
                f"tool type {kind!r} is one of Anthropic's server tools, which this server does not run; "
                "give a custom tool (name, description, input_schema)"
            )
        return data

    @field_validator("input_schema")
    @classmethod
    def _object_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        if v.get("type") != "object":
            raise ValueError('input_schema must be a JSON schema with "type": "object"')
        return check_schema(v)

    def to_chat(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.input_schema}
        if self.description is not None:
            function["description"] = self.description
        if self.strict is not None:
            function["strict"] = self.strict
        return {"type": "function", "function": function}


class McpToolConfiguration(Strict):
    enabled: bool = True
    allowed_tools: list[str] | None = None


class McpServer(Strict):
    """The MCP connector's server (`mcp_servers`): a remote server by URL (when --mcp-allow-hosts
    admits its host), or a configured one as `mcp://<name>` (or its bare name)."""

    type: Literal["url"]
    url: str = Field(min_length=1)
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    authorization_token: str | None = Field(default=None, repr=False)
    tool_configuration: McpToolConfiguration | None = None

    def to_chat(self) -> dict[str, Any] | None:
        """The chat `mcp` tool of this server (None when its tools are disabled): its calls run at
        once, as the connector's do."""
        config = self.tool_configuration or McpToolConfiguration()
        if not config.enabled:
            return None
        tool: dict[str, Any] = {"type": "mcp", "server_label": self.name, "server_url": self.url}
        tool |= {"require_approval": "never", "allowed_tools": config.allowed_tools}
        if self.authorization_token is not None:
            tool["authorization"] = self.authorization_token
        return {k: v for k, v in tool.items() if v is not None}


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False

    @model_validator(mode="after")
    def _name_with_tool(self) -> ToolChoice:
        if (self.type == "tool") != (self.name is not None):
            raise ValueError('a name is given with type "tool", and only then')
        return self

    def to_chat(self) -> Any:
        if self.type == "tool":
            return {"type": "function", "function": {"name": self.name}}
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Thinking(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)
    display: Literal["summarized"] | None = None  # the whole thinking comes back, more than a summary

    @model_validator(mode="after")
    def _budget_when_enabled(self) -> Thinking:
        if (self.type == "enabled") != (self.budget_tokens is not None):
            raise ValueError('budget_tokens is given with type "enabled", and only then')
        return self

    def chat_fields(self) -> dict[str, Any]:
        """enable_thinking for the template, and the budget of the reasoning block."""
        if self.type == "disabled":
            return {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_budget_tokens": 0}
        fields: dict[str, Any] = {"chat_template_kwargs": {"enable_thinking": True}}
        if self.budget_tokens is not None:
            fields["reasoning_budget_tokens"] = self.budget_tokens
        return fields


class OutputFormat(Strict):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")

    @field_validator("schema_")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        return check_schema(v)


class OutputConfig(Strict):
    format: OutputFormat | None = None
    effort: None = None  # Claude's effort levels map onto nothing a local model has


class Metadata(Strict):
    user_id: str | None = None


class CountTokensRequest(BaseModel):
    """/v1/messages/count_tokens: what the prompt holds, without generation settings."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None  # one model per server: any name is answered by it, bar adapters' names
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    cache_control: dict[str, Any] | None = None  # prompt caching is automatic here

    @model_validator(mode="after")
    def _known_extras(self) -> CountTokensRequest:
        check_extras(self.model_extra, self._own_fields())
        return self

    def _own_fields(self) -> frozenset[str]:
        """llama-server's fields this API has its own way to say (or, telemetry, no place for)."""
        return TELEMETRY | (THINKING_FIELDS if self.thinking else frozenset())

    def to_chat(self, stream: bool = False) -> ChatCompletionRequest:
        """The chat request this body means (400 naming an Anthropic field for what cannot be)."""
        fields: dict[str, Any] = {
            **passed_extras(self.model_extra, self._own_fields()),
            "messages": chat_messages(self),
            "stream": stream,
            "model": self.model,  # a LoRA adapter served as a model (server/model/lora.py)
        }
        if self.tools:
            fields["tools"] = [tool.to_chat() for tool in self.tools]
            if self.tool_choice is not None and self.tool_choice.disable_parallel_tool_use:
                fields["parallel_tool_calls"] = False  # else llama-server's default: the template's
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice.to_chat()
        if self.thinking is not None:
            fields |= self.thinking.chat_fields()
        if self.output_config is not None and self.output_config.format is not None:
            if self.tools and fields.get("tool_choice") != "none":
                raise errors.invalid_request("'output_config.format' cannot be combined with tools here")
            fields["json_schema"] = self.output_config.format.schema_
        return ChatCompletionRequest.model_validate(fields | self.generation_fields())

    def generation_fields(self) -> dict[str, Any]:
        return {}


class MessagesRequest(CountTokensRequest):
    """/v1/messages."""

    max_tokens: int = Field(ge=1)  # required, as Anthropic requires it
    stream: bool = False
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    temperature: float | None = Field(default=None, ge=0.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    metadata: Metadata | None = None  # accepted: it changes nothing generated
    service_tier: Literal["auto", "standard_only"] | None = None  # one tier here
    # Accepted, changing nothing generated: where and how fast Anthropic runs it, whom it is for.
    speed: Literal["standard", "fast"] | None = None
    inference_geo: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None
    # Anthropic's services this server does not have: accepted only as null (a value would be ignored).
    container: None = None  # code-execution containers
    diagnostics: None = None  # cache-miss explanations of an earlier message
    # The MCP connector: servers whose tools Llamba runs in a server-side tool loop (server/agents/loop.py).
    mcp_servers: list[McpServer] | None = None
    # Llamba's tool-loop limits, as on chat requests (only with mcp_servers).
    max_tool_rounds: int | None = Field(default=None, ge=1)
    tool_timeout: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _distinct_servers(self) -> MessagesRequest:
        names = [server.name for server in self.mcp_servers or ()]
        if len(set(names)) != len(names):
            raise ValueError("mcp_servers: two servers have the same name")
        return self

    def generation_fields(self) -> dict[str, Any]:
        fields = {"max_tokens": self.max_tokens, "stop": self.stop_sequences}
        fields |= {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        fields |= {"max_tool_rounds": self.max_tool_rounds, "tool_timeout": self.tool_timeout}
        servers = [tool for tool in (s.to_chat() for s in self.mcp_servers or ()) if tool is not None]
        if servers:
            fields["tools"] = [*(tool.to_chat() for tool in self.tools or ()), *servers]
        return {name: value for name, value in fields.items() if value is not None}


def chat_messages(body: CountTokensRequest) -> list[dict[str, Any]]:
    """The conversation as chat messages; a tool_result must answer a tool_use of the message before."""
    chat: list[dict[str, Any]] = []
    if body.system is not None:
        texts = [body.system] if isinstance(body.system, str) else [b.text for b in body.system]
        # llama-server joins the blocks with nothing between them
        chat.append({"role": "system", "content": "".join(stable_billing_header(t) for t in texts)})
    for i, message in enumerate(body.messages):
        if isinstance(message.content, str):
            chat.append({"role": message.role, "content": message.content})
        elif message.role == "assistant":
            chat += assistant_messages(message.content, f"messages.{i}")
        else:
            asked = body.messages[i - 1] if i > 0 else None
            chat += user_messages(message.content, tool_use_ids(asked), f"messages.{i}")
    return chat


BILLING_HEADER = re.compile(r"^(x-anthropic-billing-header:[^\n]*?cch=)[^;\n]{5};")


def stable_billing_header(text: str) -> str:
    """Claude Code starts its system prompt with a billing line whose `cch=` hash changes on every
    request; left as it is, no prompt would share a cached prefix with the one before. Its 5 hash
    characters become fffff, as llama-server does (llama.cpp PR 21793)."""
    return BILLING_HEADER.sub(r"\1fffff;", text, count=1)


def tool_use_ids(message: Message | None) -> set[str]:
    if message is None or message.role != "assistant" or isinstance(message.content, str):
        return set()
    return {block.id for block in message.content if isinstance(block, ToolUseBlock)}


def assistant_messages(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    """Text, thinking and tool_use blocks as an assistant message (content, reasoning, tool calls); an
    MCP call's result (mcp_tool_result) is a tool message after it, and what follows a new message."""
    out: list[dict[str, Any]] = []
    calls: set[str] = set()
    current: dict[str, Any] | None = None
    for j, block in enumerate(blocks):
        if isinstance(block, McpToolResultBlock):
            if block.tool_use_id not in calls:
                raise errors.invalid_request(
                    f"'{where}.content.{j}.tool_use_id': {block.tool_use_id!r} answers no mcp_tool_use "
                    "block before it in this message"
                )
            out.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
            current = None
            continue
        if current is None:
            current = {"role": "assistant", "content": ""}
            out.append(current)
        if isinstance(block, TextBlock):
            current["content"] = join_parts(current["content"], block.text)
        elif isinstance(block, ThinkingBlock):
            current["reasoning_content"] = current.get("reasoning_content", "") + block.thinking
        elif isinstance(block, ToolUseBlock | McpToolUseBlock):
            name = block.name if isinstance(block, ToolUseBlock) else f"{block.server_name}_{block.name}"
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": name, "arguments": arguments}
            current.setdefault("tool_calls", []).append(
                {"id": block.id, "type": "function", "function": function}
            )
            calls.add(block.id)
        else:
            raise errors.invalid_request(
                f"'{where}.content.{j}': {block.type} blocks belong in user messages"
            )
    return out or [{"role": "assistant", "content": ""}]


def user_messages(blocks: list[Any], asked: set[str], where: str) -> list[dict[str, Any]]:
    """Text blocks as one user message, then tool_result blocks as tool messages: llama-server's order
    (its convert_anthropic_to_oai puts a message's text before its tool results, whatever the blocks'
    order)."""
    text: str | None = None
    parts: list[dict[str, Any]] = []  # with images: the message's parts in order (text and image_url)
    results: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text = join_parts(text or "", block.text)
            parts.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            parts.append({"type": "image_url", "image_url": {"url": block.url()}})
        elif isinstance(block, ToolResultBlock):
            if block.tool_use_id not in asked:
                raise errors.invalid_request(
                    f"'{where}.content.{j}.tool_use_id': {block.tool_use_id!r} answers no tool_use block "
                    "of the previous (assistant) message"
                )
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": block.text()})
        else:
            raise errors.invalid_request(
                f"'{where}.content.{j}': {block.type} blocks belong in assistant messages"
            )
    if any(part["type"] == "image_url" for part in parts):
        return [{"role": "user", "content": parts}, *results]
    return ([{"role": "user", "content": text}] if text is not None else []) + results


def join_parts(text: str, part: str) -> str:
    """A message's text parts as llama.cpp flattens them for a template: a newline before a part when
    the text so far is not empty."""
    return f"{text}\n{part}" if text else part
