"""OpenAI's Responses API request body (pydantic), and its translation into a chat request.

`POST /v1/responses` validates here (a 400 naming the field, in OpenAI's error shape); `to_chat` then
turns the body, after the stored conversation its `previous_response_id` continues, into the
`ChatCompletionRequest` the one generation path takes: `instructions` as the system message, input
messages with their text parts, `function_call` items as the assistant's tool calls,
`function_call_output` items as tool messages, `reasoning` items as the assistant's reasoning,
`mcp_call` items (an earlier run's MCP calls) as the assistant's calls and their results,
`mcp_approval_request` items as calls waiting for approval (`mcp_approval_response` items are settled by
server/apis/responses/approvals.py); flat function
tools, `mcp` tools (configured MCP servers, run by server/agents/loop.py), tool_choice (a function or an MCP
server's tool), max_output_tokens, `text.format` and `reasoning.effort` onto their chat fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from server.chat.schemas import ChatCompletionRequest
from server.chat.tool_schemas import TOOL_NAME, McpServerTool
from server.chat.unsupported import check_extras, passed_extras
from server.config.json_schema import check_schema
from server.http import errors

# A reasoning effort that maps onto the chat template's thinking switch; other levels have no meaning
# for a local model's template, and are refused rather than ignored.
EFFORTS = {
    "none": {"chat_template_kwargs": {"enable_thinking": False}, "reasoning_budget_tokens": 0},
    "medium": {},
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(Strict):
    """A message's text: input_text (any role), output_text (an assistant's earlier answer), refusal."""

    type: Literal["input_text", "output_text", "refusal"]
    text: str | None = None
    refusal: str | None = None  # type refusal
    annotations: list[dict[str, Any]] | None = None  # output_text: echoed back from an earlier output
    logprobs: list[dict[str, Any]] | None = None

    def plain(self) -> str:
        return (self.refusal if self.type == "refusal" else self.text) or ""


class ImagePart(Strict):
    """An input_image: its image_url (a data: URL, or what the chat route refuses) as an image_url part
    of the chat message, as llama-server converts it."""

    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None

    def chat_part(self) -> dict[str, Any]:
        if not self.image_url:
            raise errors.invalid_request("an input_image needs its image_url (file_id is not supported)")
        return {"type": "image_url", "image_url": {"url": self.image_url}}


class RefusedPart(BaseModel):
    type: Literal["input_file", "input_audio"]

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        raise ValueError(f"{kind} parts are not supported: this server's models read text only")


Part = Annotated[TextPart | ImagePart | RefusedPart, Field(discriminator="type")]


def text_of(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    if any(isinstance(p, ImagePart) for p in content):
        raise errors.invalid_request("input_image parts belong in user messages")
    return "\n".join(p.plain() for p in content)


def user_content(content: str | list[Any]) -> str | list[dict[str, Any]]:
    """A user message's content for the chat: its text, or with images its parts in order."""
    if isinstance(content, str) or not any(isinstance(p, ImagePart) for p in content):
        return text_of(content)
    return [
        p.chat_part() if isinstance(p, ImagePart) else {"type": "text", "text": p.plain()} for p in content
    ]


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None
    status: str | None = None
    phase: Literal["commentary", "final_answer"] | None = None  # an assistant message's part: one text


class FunctionCallItem(Strict):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(pattern=TOOL_NAME)
    arguments: str
    id: str | None = None
    status: str | None = None
    # What OpenAI's output items carry (an SDK's dump of an earlier output sends them back): who made
    # the call, the tool's namespace, whether it ran asynchronously. History only: the model reads the
    # call's name and arguments (docs/compatibility.md).
    caller: dict[str, Any] | None = None
    namespace: str | None = None
    async_: bool | None = Field(default=None, alias="async")


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[Part]
    id: str | None = None
    status: str | None = None
    caller: dict[str, Any] | None = None  # as on function_call: history only
    name: str | None = None
    namespace: str | None = None


class ReasoningText(Strict):
    type: Literal["reasoning_text", "summary_text"]
    text: str


class ReasoningItem(Strict):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[ReasoningText] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: Literal[""] | None = None  # OpenAI's encrypted reasoning: nothing here reads it
    status: str | None = None

    def text(self) -> str:
        return "\n".join(part.text for part in (self.content or self.summary))


class McpCallItem(Strict):
    """An earlier response's MCP call (its output sent back): the assistant's call and its result."""

    type: Literal["mcp_call"]
    id: str = Field(min_length=1)
    server_label: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    output: str | None = None
    error: str | dict[str, Any] | None = None
    status: str | None = None
    approval_request_id: str | None = None  # a call run once the client approved it

    def result(self) -> dict[str, Any]:
        """The tool message the model read (an error as server/agents/loop.py words it); an approved
        call's result answers its approval request's call."""
        call_id = self.approval_request_id or self.id
        if self.error is None:
            return {"role": "tool", "tool_call_id": call_id, "content": self.output or ""}
        text = f"Error: {error_text(self.error)}"
        return {"role": "tool", "tool_call_id": call_id, "content": text, "is_error": True}


class McpApprovalRequestItem(Strict):
    """An earlier response's request to approve an MCP call: the assistant's call, not run (yet)."""

    type: Literal["mcp_approval_request"]
    id: str = Field(min_length=1)
    server_label: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str


class McpApprovalResponseItem(Strict):
    """The client's answer to an approval request: the call runs (approve) or is told it may not."""

    type: Literal["mcp_approval_response"]
    approval_request_id: str = Field(min_length=1)
    approve: bool
    reason: str | None = None
    id: str | None = None


def error_text(error: str | dict[str, Any]) -> str:
    if isinstance(error, str):
        return error
    parts = error.get("content")
    if isinstance(parts, list):
        return "\n".join(str(p.get("text", "")) for p in parts if isinstance(p, dict))
    return str(error.get("message", ""))


class McpListToolsItem(Strict):
    """An earlier response's record of an MCP server's tools. It adds nothing to the conversation:
    the tools a response offers are its own request's `mcp` tools, listed afresh."""

    type: Literal["mcp_list_tools"]
    id: str | None = None
    server_label: str
    tools: list[dict[str, Any]]
    error: str | None = None


InputItem = Annotated[
    MessageItem
    | FunctionCallItem
    | FunctionCallOutputItem
    | ReasoningItem
    | McpCallItem
    | McpListToolsItem
    | McpApprovalRequestItem
    | McpApprovalResponseItem,
    Field(discriminator="type"),
]


class FunctionTool(Strict):
    """Responses' flat function tool."""

    type: Literal["function"]
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # true: `parameters` means what JSON Schema says (model/llama_schema.py)

    @model_validator(mode="before")
    @classmethod
    def _function_tools_only(cls, data: Any) -> Any:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind != "function":
            raise ValueError(
                f"tool type {kind!r} is one of OpenAI's built-in tools, which this server does not run"
            )
        return data

    @field_validator("parameters")
    @classmethod
    def _valid_schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if v is None else check_schema(v)

    def to_chat(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump(exclude_none=True, exclude={"type"})}


def tool_kind(data: Any) -> str:
    """Which tool model validates a `tools` entry: `mcp` ones as MCP servers, every other type as a
    function tool (whose validator names the built-in tool types this server does not run)."""
    kind = data.get("type") if isinstance(data, dict) else getattr(data, "type", None)
    return "mcp" if kind == "mcp" else "function"


ResponsesTool = Annotated[
    Annotated[FunctionTool, Tag("function")] | Annotated[McpServerTool, Tag("mcp")],
    Discriminator(tool_kind),
]


def tool_to_chat(tool: FunctionTool | McpServerTool) -> dict[str, Any]:
    if isinstance(tool, McpServerTool):
        return tool.model_dump(exclude_none=True)
    return tool.to_chat()


class NamedFunction(Strict):
    type: Literal["function"]
    name: str


class NamedMcpTool(Strict):
    """tool_choice forcing one tool of an MCP server (the model calls it as `<server_label>_<name>`)."""

    type: Literal["mcp"]
    server_label: str
    name: str | None = None

    def chat_name(self) -> str:
        return f"{self.server_label}_{self.name}"


class TextFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None

    @model_validator(mode="after")
    def _schema_with_json_schema(self) -> TextFormat:
        if (self.type == "json_schema") != (self.schema_ is not None):
            raise ValueError('a schema is given with type "json_schema", and only then')
        if self.schema_ is not None:
            check_schema(self.schema_)
        return self

    def to_chat(self) -> dict[str, Any]:
        if self.type != "json_schema":
            return {"type": self.type}
        spec = {"name": self.name, "schema": self.schema_, "strict": self.strict}
        return {"type": "json_schema", "json_schema": {k: v for k, v in spec.items() if v is not None}}


class TextConfig(Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None  # a local model has no verbosity switch


class Reasoning(Strict):
    effort: str | None = None
    summary: Literal["auto"] | None = None  # no summaries are made: the reasoning comes back whole
    generate_summary: Literal["auto"] | None = None

    @field_validator("effort")
    @classmethod
    def _effort_that_maps(cls, v: str | None) -> str | None:
        if v is not None and v not in EFFORTS:
            raise ValueError(
                f"effort {v!r} does not map onto this server: 'none' turns thinking off, 'medium' keeps "
                "the server's reasoning settings (reasoning_budget_tokens sets a budget)"
            )
        return v


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None  # one model per server: any name is answered by it
    input: str | list[InputItem] = ""
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | NamedMcpTool | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    reasoning: Reasoning | None = None
    text: TextConfig | None = None
    previous_response_id: str | None = None
    store: bool = True
    background: bool = False
    stream: bool = False
    metadata: dict[str, str] | None = Field(default=None, max_length=16)
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None  # a prompt too long is a 400, never cut silently
    top_logprobs: Literal[0] | None = None
    max_tool_calls: int | None = Field(
        default=None, ge=1
    )  # the MCP calls a run makes (server/agents/loop.py)
    # Llamba's tool-loop limits, as on chat requests (only with mcp tools).
    max_tool_rounds: int | None = Field(default=None, ge=1)
    tool_timeout: float | None = Field(default=None, gt=0)
    # Accepted, changing nothing generated.
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None  # include_obfuscation: no obfuscation is added
    prompt_cache_options: dict[str, Any] | None = None  # prompts are cached here anyway
    # OpenAI's services this server does not have: accepted only as null (a value would be ignored).
    conversation: None = None  # the Conversations API; previous_response_id chains responses here
    context_management: None = None
    moderation: None = None
    prompt: None = None  # saved prompt templates
    background_options: None = None
    access_programs: None = None

    @field_validator("include")
    @classmethod
    def _nothing_to_include(cls, v: list[str] | None) -> list[str] | None:
        if v:
            raise ValueError(f"{v[0]!r} cannot be included: this server returns no extra output data")
        return v

    @model_validator(mode="before")
    @classmethod
    def _messages_are_typed(cls, data: Any) -> Any:
        """An input message may leave out its type (EasyInputMessage)."""
        if isinstance(data, dict) and isinstance(data.get("input"), list):
            typed = [
                {"type": "message", **i} if isinstance(i, dict) and "type" not in i else i
                for i in data["input"]
            ]
            data = {**data, "input": typed}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ResponsesRequest:
        check_extras(self.model_extra)
        if self.background and not self.store:
            raise ValueError("background responses must be stored: store cannot be false")
        choice = self.tool_choice
        names = [t.name for t in self.tools or () if isinstance(t, FunctionTool)]
        if isinstance(choice, NamedFunction) and choice.name not in names:
            raise ValueError(f"tool_choice names {choice.name!r}, which is not among the tools")
        labels = [t.server_label for t in self.mcp_tools()]
        if isinstance(choice, NamedMcpTool) and choice.server_label not in labels:
            raise ValueError(
                f"tool_choice names server_label {choice.server_label!r}, not among the mcp tools"
            )
        if isinstance(choice, NamedMcpTool) and choice.name is None:
            raise ValueError(
                "tool_choice.name: name the MCP tool to call (forcing any tool of a server is not supported)"
            )
        return self

    def mcp_tools(self) -> list[McpServerTool]:
        return [t for t in self.tools or () if isinstance(t, McpServerTool)]

    def approval_responses(self) -> list[tuple[int, McpApprovalResponseItem]]:
        """The input's answers to approval requests, with their places in `input`."""
        items = self.input if isinstance(self.input, list) else []
        return [(i, item) for i, item in enumerate(items) if isinstance(item, McpApprovalResponseItem)]

    def to_chat(self, conversation: list[dict[str, Any]], stream: bool) -> ChatCompletionRequest:
        """The chat request of `conversation` (the stored one continued, then this input's messages)."""
        system = [{"role": "system", "content": self.instructions}] if self.instructions else []
        fields: dict[str, Any] = {
            **passed_extras(self.model_extra),
            "messages": system + conversation,
            "stream": stream,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        return ChatCompletionRequest.model_validate(fields | self.chat_fields())

    def chat_fields(self) -> dict[str, Any]:
        choice = self.tool_choice
        named = choice.chat_name() if isinstance(choice, NamedMcpTool) else getattr(choice, "name", None)
        fields: dict[str, Any] = {
            "tools": [tool_to_chat(tool) for tool in self.tools] if self.tools else None,
            "tool_choice": {"type": "function", "function": {"name": named}} if named else choice,
            "max_tool_rounds": self.max_tool_rounds,
            "tool_timeout": self.tool_timeout,
            "max_tokens": self.max_output_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
        }
        if self.text is not None and self.text.format is not None and self.text.format.type != "text":
            fields["response_format"] = self.text.format.to_chat()
        if self.reasoning is not None and self.reasoning.effort is not None:
            fields |= EFFORTS[self.reasoning.effort]
        return {name: value for name, value in fields.items() if value is not None}

    def input_messages(self, history: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """This request's input as chat messages (what the stored conversation grows by)."""
        if isinstance(self.input, str):
            messages = [{"role": "user", "content": self.input}] if self.input else []
        else:
            messages = ItemTranslation(known_calls(history)).messages(self.input)
        if not messages and not self.approval_responses():
            raise errors.invalid_request("'input': give the input (a string or a list of items)")
        return messages


def approval_call(item: McpApprovalRequestItem) -> dict[str, Any]:
    """An approval request as the assistant's call (its id the request's: the approval names it)."""
    function = {"name": f"{item.server_label}_{item.name}", "arguments": item.arguments}
    return {"id": item.id, "type": "function", "function": function}


def known_calls(messages: list[dict[str, Any]]) -> set[str]:
    return {call["id"] for m in messages for call in m.get("tool_calls") or () if call.get("id")}


class ItemTranslation:
    """Input items into chat messages: an assistant's text, reasoning and calls make one message."""

    def __init__(self, calls: set[str]) -> None:
        self.calls = calls  # the call ids a function_call_output may answer
        self.out: list[dict[str, Any]] = []
        self.reasoning: list[str] = []  # reasoning waiting for the assistant message it belongs to
        self.results: list[dict[str, Any]] = []  # MCP results, after the calls of their message

    def messages(self, items: list[Any]) -> list[dict[str, Any]]:
        for i, item in enumerate(items):
            if not isinstance(item, McpCallItem | McpListToolsItem | McpApprovalRequestItem):
                self.out += self.results
                self.results = []
            if isinstance(item, McpCallItem):
                self.mcp_call(item, f"input.{i}")
            elif isinstance(item, McpApprovalRequestItem):
                self.assistant().setdefault("tool_calls", []).append(approval_call(item))
                self.calls.add(item.id)
            elif isinstance(item, McpListToolsItem | McpApprovalResponseItem):
                continue  # an approval is settled by the route (server/apis/responses/approvals.py)
            elif isinstance(item, ReasoningItem):
                self.reasoning.append(item.text())
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function"}
                call["function"] = {"name": item.name, "arguments": item.arguments}
                self.assistant().setdefault("tool_calls", []).append(call)
                self.calls.add(item.call_id)
            elif isinstance(item, FunctionCallOutputItem):
                self.tool_result(item, f"input.{i}")
            elif item.role == "assistant":
                self.assistant(text_of(item.content))
            else:
                role = "system" if item.role == "developer" else item.role
                content = user_content(item.content) if role == "user" else text_of(item.content)
                self.out.append({"role": role, "content": content})
        if self.reasoning:
            self.assistant()
        return self.out + self.results

    def mcp_call(self, item: McpCallItem, where: str) -> None:
        """The call on the assistant message (consecutive calls share one, as a run's round made
        them), its result after that message; an approved call's result answers its approval request."""
        if item.approval_request_id is not None:
            if item.approval_request_id not in self.calls:
                raise errors.invalid_request(
                    f"'{where}.approval_request_id': {item.approval_request_id!r} is no mcp_approval_request "
                    "of this input or of the conversation it continues"
                )
            self.out.append(item.result())
            return
        call = {"id": item.id, "type": "function"}
        call["function"] = {"name": f"{item.server_label}_{item.name}", "arguments": item.arguments}
        self.assistant().setdefault("tool_calls", []).append(call)
        self.calls.add(item.id)
        self.results.append(item.result())

    def assistant(self, text: str | None = None) -> dict[str, Any]:
        """The assistant message being built (a new one after any other message, or for new text)."""
        last = self.out[-1] if self.out else None
        if last is None or last["role"] != "assistant" or (text is not None and last.get("tool_calls")):
            last = {"role": "assistant", "content": ""}
            self.out.append(last)
        if text is not None:
            last["content"] += text
        if self.reasoning:
            last["reasoning_content"] = last.get("reasoning_content", "") + "\n".join(self.reasoning)
            self.reasoning = []
        return last

    def tool_result(self, item: FunctionCallOutputItem, where: str) -> None:
        if item.call_id not in self.calls:
            raise errors.invalid_request(
                f"'{where}.call_id': {item.call_id!r} answers no function_call of this input or of the "
                "conversation it continues"
            )
        self.out.append({"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)})
