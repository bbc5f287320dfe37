"""Request bodies (pydantic). Every generation field is acted on or refused (server/unsupported.py)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.sampling import SamplingParams
from server.schemas_tools import ConstraintFields, ToolFields
from server.unsupported import unsupported


class GenerationFields(ConstraintFields):
    """Fields shared by every generation route (OpenAI names and llama-server's native ones)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=-1)
    max_completion_tokens: int | None = Field(default=None, ge=-1)
    n_predict: int | None = Field(default=None, ge=-1)
    temperature: float | None = Field(default=None, ge=0.0)
    top_k: int | None = None
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    repeat_penalty: float | None = Field(default=None, gt=0.0)
    repeat_last_n: int | None = Field(default=None, ge=-1)
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=1)
    cache_prompt: bool = True
    id_slot: int = -1
    ignore_eos: bool = False
    timings_per_token: bool = False
    return_progress: bool = False
    verbose: bool = False
    # llama-server's per-request speculation (keys with dots); None: the server's --spec-* settings.
    speculative_type: str | list[str] | None = Field(default=None, alias="speculative.type")
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max")
    speculative_n_min: int | None = Field(default=None, alias="speculative.n_min")
    speculative_p_min: float | None = Field(default=None, alias="speculative.p_min")

    @model_validator(mode="after")
    def _nothing_ignored(self) -> GenerationFields:
        problems = unsupported(self.model_extra)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if isinstance(v, str):
            return [v]
        if v is not None and len(v) > 16:
            raise ValueError("at most 16 stop sequences")
        return v

    def stop_list(self) -> tuple[str, ...]:
        return tuple(self.stop or ())  # type: ignore[arg-type]

    def max_new_tokens(self, server_default: int) -> int:
        for value in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if value is not None:
                return value
        return server_default

    def sampling(self, defaults: SamplingParams, n_vocab: int, n_probs: int = 0) -> SamplingParams:
        def pick(value: Any, default: Any) -> Any:
            return default if value is None else value

        return SamplingParams(
            temperature=pick(self.temperature, defaults.temperature),
            top_k=pick(self.top_k, defaults.top_k),
            top_p=pick(self.top_p, defaults.top_p),
            min_p=pick(self.min_p, defaults.min_p),
            repeat_penalty=pick(self.repeat_penalty, defaults.repeat_penalty),
            repeat_last_n=pick(self.repeat_last_n, defaults.repeat_last_n),
            presence_penalty=pick(self.presence_penalty, defaults.presence_penalty),
            frequency_penalty=pick(self.frequency_penalty, defaults.frequency_penalty),
            logit_bias=parse_logit_bias(self.logit_bias, n_vocab),
            seed=pick(self.seed, defaults.seed),
            n_probs=n_probs,
        )


def parse_logit_bias(raw: dict[str, float | bool] | list[list[Any]] | None, n_vocab: int) -> dict[int, float]:
    """OpenAI's {"token id": bias} or llama-server's [[id, bias|false], ...]; false bans the token."""
    if not raw:
        return {}
    pairs = raw.items() if isinstance(raw, dict) else [(p[0], p[1]) for p in raw if len(p) == 2]
    bias: dict[int, float] = {}
    for key, value in pairs:
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias: '{key}' is not a token id") from None
        if not 0 <= token < n_vocab:
            raise ValueError(f"logit_bias: token id {token} is outside the vocabulary")
        bias[token] = float("-inf") if value is False else float(value)
    return bias


class ToolCallMessage(BaseModel):
    """An earlier call in the history (an assistant message's tool_calls)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: dict[str, Any]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this is the result of
    reasoning_content: str | None = None


class ChatCompletionRequest(GenerationFields, ToolFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    chat_template_kwargs: dict[str, Any] | None = None
    # Assistant prefill: continue the last (assistant) message instead of opening a new turn. None: when
    # the last message is the assistant's, as llama-server does; vLLM's flag, exclusive with the next.
    continue_final_message: bool | None = None
    add_generation_prompt: bool | None = None
    # Reasoning (llama-server's names; thinking_* are what some clients send). None: the server default.
    reasoning_format: Literal["none", "deepseek", "auto"] | None = None
    reasoning_budget_tokens: int | None = Field(default=None, ge=-1)
    thinking_budget_tokens: int | None = Field(default=None, ge=-1)
    reasoning_budget_message: str | None = None
    thinking_budget_message: str | None = None
    reasoning_control: bool = False

    @model_validator(mode="after")
    def _prefill_or_new_turn(self) -> ChatCompletionRequest:
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
        return self

    def n_probs(self) -> int:
        return (self.top_logprobs or 1) if self.logprobs else 0

    def reasoning_budget(self, server_default: int) -> int:
        for value in (self.reasoning_budget_tokens, self.thinking_budget_tokens):
            if value is not None:
                return value
        return server_default

    def budget_message(self, server_default: str) -> str:
        for value in (self.reasoning_budget_message, self.thinking_budget_message):
            if value is not None:
                return value
        return server_default


class ControlRequest(BaseModel):
    """/v1/chat/completions/control: act on a running chat completion by its id."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    action: str = Field(min_length=1)
    model: str | None = None  # routes the call in router mode; ignored by a single-model server


class CompletionRequest(GenerationFields):
    """/v1/completions (OpenAI) and /completion (llama-server's native shape)."""

    prompt: str | list[int] | list[str] = ""
    logprobs: int | None = Field(default=None, ge=0, le=20)
    n_probs: int = Field(default=0, ge=0, le=100)
    echo: bool = False

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            return v[0]
        return v  # type: ignore[return-value]


class TokenizeRequest(BaseModel):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(BaseModel):
    tokens: list[int]


class ApplyTemplateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    continue_final_message: bool | None = None  # as on chat: None continues a final assistant message
    add_generation_prompt: bool | None = None
