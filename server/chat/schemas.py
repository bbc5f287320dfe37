"""Request bodies (pydantic). Every generation field is acted on, refused, or (unknown, as llama-server
does) ignored and noted: server/chat/unsupported.py says which."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictStr,
    ValidationError,
    field_validator,
    model_validator,
)

from engine.api import SamplingParams
from server.chat import llama_field_rules
from server.chat.tool_schemas import ConstraintFields, ToolFields
from server.chat.unsupported import unsupported
from server.http import errors
from server.model.sampling import NUMBER_FIELDS, parse_samplers

# The template's `reasoning_effort` (OpenAI's levels and llama-server's).
ReasoningEffort = Literal["minimal", "low", "medium", "high", "xhigh", "max"]


class GenerationFields(ConstraintFields):
    """Fields shared by every generation route (OpenAI names and llama-server's native ones)."""

    model_config = ConfigDict(extra="allow")
    IS_CHAT: ClassVar[bool] = False  # a chat body (its template's parser wins over `chat_parser`)

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
    repeat_last_n: int | None = Field(default=None, ge=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = None
    # llama-server's samplers beyond the default chain (engine/sampling/params.py says what each does)
    typical_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_n_sigma: float | None = None
    min_keep: int | None = Field(default=None, ge=0)
    xtc_probability: float | None = Field(default=None, ge=0.0, le=1.0)
    xtc_threshold: float | None = Field(default=None, ge=0.0, le=1.0)
    dynatemp_range: float | None = Field(default=None, ge=0.0)
    dynatemp_exponent: float | None = Field(default=None, ge=0.0)
    dry_multiplier: float | None = Field(default=None, ge=0.0)
    dry_base: float | None = Field(default=None, ge=1.0)
    dry_allowed_length: int | None = Field(default=None, ge=0)
    dry_penalty_last_n: int | None = Field(default=None, ge=0)
    dry_sequence_breakers: list[str] | None = Field(default=None, min_length=1)
    mirostat: int | None = Field(default=None, ge=0, le=2)
    mirostat_tau: float | None = Field(default=None, ge=0.0)
    mirostat_eta: float | None = Field(default=None, ge=0.0)
    # the adaptive-p sampler (only where `samplers` names adaptive_p); a negative target: off
    adaptive_target: float | None = None
    adaptive_decay: float | None = Field(default=None, ge=0.0, le=0.99)
    samplers: list[str] | str | None = None
    post_sampling_probs: bool = False
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1)  # choices (at most the server's slots: checked by the route)
    n_cmpl: int | None = Field(default=None, ge=1)  # llama-server's name for it (wins over `n`)
    cache_prompt: bool = True
    id_slot: int = -1
    ignore_eos: bool | None = None  # None: the server's --ignore-eos
    timings_per_token: bool = False
    return_progress: bool = False
    # llama-server's time limit on generation: past this many ms after the first token, the next token
    # whose text holds a newline ends it (stop_type limit; <= 0: none).
    t_max_predict_ms: int = Field(default=-1, ge=-1)
    # tokens a context shift drops after the kept ones (0: half of the rest), as llama-server's n_discard
    n_discard: int = Field(default=0, ge=0)
    # tokens of the prompt a context shift keeps (-1: all; llama-server adds one where the model adds
    # BOS); None: the server's --keep
    n_keep: int | None = Field(default=None, ge=-1)
    # llama-server's n_indent: a generated line after the first indented by fewer spaces and tabs ends
    # the generation (stop_type limit), its text cut where the indentation ends; 0: no rule
    n_indent: int = Field(default=0, ge=0)
    # llama-server's per-request LoRA scales, [{id, scale}] (server/model/lora.py checks them against the
    # loaded adapters); None: the global scales
    lora: Any = None
    verbose: bool | None = None  # `__verbose` in the reply; None: the server's -v (llama-server's rule)
    # llama-server's per-request speculation (keys with dots); None: the server's --spec-* settings.
    speculative_type: str | list[str] | None = Field(default=None, alias="speculative.type")
    speculative_n_max: int | None = Field(default=None, alias="speculative.n_max")
    speculative_n_min: int | None = Field(default=None, alias="speculative.n_min")
    speculative_p_min: float | None = Field(default=None, alias="speculative.p_min")

    @model_validator(mode="before")
    @classmethod
    def _llama_rules(cls, data: Any) -> Any:
        """llama-server's value rules (server/chat/llama_field_rules.py): nulls, JSON types, limits."""
        return llama_field_rules.apply(data, chat=cls.IS_CHAT) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _extra_fields(self) -> GenerationFields:
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

    def n_choices(self) -> int:
        return self.n_cmpl if self.n_cmpl is not None else self.n

    def max_new_tokens(self, server_default: int) -> int:
        """The tokens to generate: the body's, else (absent or -1) the server's -n; as llama-server
        (0c1e570), "the per-request limit takes priority over the global one", its names read in its
        order (n_predict, then max_completion_tokens, then max_tokens). Beyond the context, generation
        ends at the context's end (finish_reason "length")."""
        asked = next(
            (v for v in (self.n_predict, self.max_completion_tokens, self.max_tokens) if v is not None), None
        )
        return server_default if asked is None or asked < 0 else asked

    @field_validator("samplers")
    @classmethod
    def _known_samplers(cls, v: list[str] | str | None) -> list[str] | str | None:
        if v is not None:
            parse_samplers(v)  # a ValueError names the unknown one
        return v

    def sampling(
        self, defaults: SamplingParams, n_vocab: int, tokenize: Callable[[str], list[int]], n_probs: int = 0
    ) -> SamplingParams:
        """The request's sampler settings over the server's defaults. `tokenize` turns a logit_bias
        string into the tokens it biases (llama-server's: no special tokens)."""
        given = {name: getattr(self, name) for name in NUMBER_FIELDS}
        values = {name: getattr(defaults, name) if v is None else v for name, v in given.items()}
        if self.samplers is not None:
            values["samplers"] = parse_samplers(self.samplers)
        if self.dry_sequence_breakers is not None:
            values["dry_sequence_breakers"] = tuple(self.dry_sequence_breakers)
        if self.logit_bias is not None:  # replaces the server's --logit-bias, as in llama-server
            values["logit_bias"] = parse_logit_bias(self.logit_bias, n_vocab, tokenize)
        return replace(defaults, **values, n_probs=n_probs, post_sampling_probs=self.post_sampling_probs)


def parse_logit_bias(
    raw: dict[str, float | bool] | list[list[Any]], n_vocab: int, tokenize: Callable[[str], list[int]]
) -> dict[int, float]:
    """llama-server's forms: OpenAI's {"token id" or "text": bias} and [[token id or "text", bias], ...];
    a bias of false bans. A text biases each of its tokens; biases of one token add up (llama.cpp applies
    each entry). Anything llama-server would skip silently is a ValueError here."""
    if isinstance(raw, dict):
        pairs = [(_dict_key(key), value) for key, value in raw.items()]
    else:
        if any(not isinstance(p, list) or len(p) != 2 for p in raw):
            raise ValueError("'logit_bias': each entry must be a [token, bias] pair")
        pairs = [(p[0], p[1]) for p in raw]
    bias: dict[int, float] = {}
    for key, value in pairs:
        amount = _bias_value(key, value)
        for token in _bias_tokens(key, n_vocab, tokenize):
            bias[token] = bias.get(token, 0.0) + amount
    return bias


def _dict_key(key: str) -> int | str:
    """An object key is a token id when it is a whole integer (strtol's rule), else text."""
    try:
        return int(key)
    except ValueError:
        return key


def _bias_value(key: Any, value: Any) -> float:
    if value is False:
        return float("-inf")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"'logit_bias': the bias of {key!r} must be a number or false, got {value!r}")
    return float(value)


def _bias_tokens(key: Any, n_vocab: int, tokenize: Callable[[str], list[int]]) -> list[int]:
    if isinstance(key, str):
        return tokenize(key)
    if isinstance(key, bool) or not isinstance(key, int):
        raise ValueError(f"'logit_bias': {key!r} is neither a token id nor a text")
    if not 0 <= key < n_vocab:
        raise ValueError(f"'logit_bias': token id {key} is outside the vocabulary")
    return [key]


class CalledFunction(BaseModel):
    """The function of an earlier call: templates and tool formats read its name (a missing one was a
    500 found by the long fuzz), and its arguments (OpenAI's JSON text, or an object)."""

    model_config = ConfigDict(extra="allow")

    name: str
    arguments: str | dict[str, Any] | None = None


class ToolCallMessage(BaseModel):
    """An earlier call in the history (an assistant message's tool_calls)."""

    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[ToolCallMessage] | None = None  # assistant: the calls it made
    tool_call_id: str | None = None  # tool: the call this is the result of
    reasoning_content: str | None = None


class ChatCompletionRequest(GenerationFields, ToolFields):
    IS_CHAT: ClassVar[bool] = True

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # llama-server's own name, read when `logprobs` is not set (its OpenAI layer passes the body's other
    # keys on): the reply's `logprobs` with this many top_logprobs per token
    n_probs: int | None = Field(default=None, ge=0, le=100)
    chat_template_kwargs: dict[str, Any] | None = None
    # Assistant prefill: continue the last (assistant) message instead of opening a new turn. None: when
    # the last message is the assistant's, as llama-server does; vLLM's flag, exclusive with the next;
    # llama-server's "content" / "reasoning_content" name the part continued.
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None
    add_generation_prompt: bool | None = None
    # With continue_final_message named, a stream also sends the prefilled message (llama-server's echo;
    # a whole reply always holds it, joined with the continuation).
    echo: bool = False
    # Reasoning (llama-server's names; thinking_* are what some clients send). None: the server default.
    reasoning_format: Literal["none", "deepseek", "auto"] | None = None
    # Given to the chat template as `reasoning_effort` (OpenAI's levels and llama-server's); over the
    # server's --reasoning-effort.
    reasoning_effort: ReasoningEffort | None = None
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

    @model_validator(mode="after")
    def _top_logprobs_with_logprobs(self) -> ChatCompletionRequest:
        if self.top_logprobs is not None and not self.logprobs:  # llama-server's check, its words
            raise ValueError("top_logprobs requires logprobs to be set to true")
        return self

    def probs_count(self) -> int:
        """The top tokens each generated token reports: `logprobs` with `top_logprobs` (OpenAI's), else
        llama-server's `n_probs`; 0: no logprobs in the reply."""
        if self.logprobs:
            return self.top_logprobs or 1
        return self.n_probs or 0

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
    return_tokens: bool = False  # /completion and /infill: the generated token ids in a whole reply

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[int] | list[str]) -> str | list[int]:
        if isinstance(v, list) and v and isinstance(v[0], str):
            if len(v) != 1:
                raise ValueError("only one prompt per request is supported")
            return v[0]
        return v  # type: ignore[return-value]


class OpenAICompletionRequest(CompletionRequest):
    """/v1/completions: /completion's fields plus OpenAI's `suffix`, the text after the insertion point.
    With it the prompt is the prefix and the request runs as /infill would (the model's FIM tokens)."""

    suffix: str | None = None


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
    tool_choice: Any = None  # as on chat: which tools a template without tool support still shows
    chat_template_kwargs: dict[str, Any] | None = None
    # as on chat: None continues a final assistant message
    continue_final_message: bool | Literal["content", "reasoning_content"] | None = None
    add_generation_prompt: bool | None = None
    reasoning_effort: ReasoningEffort | None = None

    def shown_tools(self, describes_tools: bool) -> list[dict[str, Any]] | None:
        """The tools the prompt shows, as a chat's would: none under tool_choice none; under auto only
        where the template has tool support (server/model/constraints.py's plan_tools)."""
        choice = self.tool_choice
        demanded = choice == "required" or isinstance(choice, dict)
        if choice == "none" or not (describes_tools or demanded):
            return None
        return self.tools


class InfillChunk(BaseModel):
    """One repo-level chunk of /infill's `input_extra`: a file's text and its name."""

    model_config = ConfigDict(extra="forbid")

    text: str
    filename: str = "tmp"


class InfillRequest(CompletionRequest):
    """llama-server's /infill: code around a hole (`input_prefix`, `input_suffix`), other files of the
    repository (`input_extra`), and `prompt`, text the middle starts with; the generation fields of
    /completion."""

    prompt: str = ""  # type: ignore[assignment]
    response_fields: list[StrictStr] | None = None  # as /completion's
    input_prefix: str | list[int]
    input_suffix: str | list[int]
    input_extra: list[InfillChunk] = []

    @model_validator(mode="after")
    def _no_echo(self) -> InfillRequest:
        """OpenAI's `echo` belongs to /v1/completions (`logprobs` is read as n_probs, as llama-server)."""
        if "echo" in self.model_fields_set:
            raise ValueError("'echo' is not an /infill field")
        return self


class SlotActionRequest(BaseModel):
    """POST /slots/<id>?action=save|restore: the slot file's name (erase needs none)."""

    model_config = ConfigDict(extra="allow")

    filename: str | None = None


class StreamLookupRequest(BaseModel):
    """POST /v1/streams/lookup: the resumable streams to report on."""

    conversation_ids: list[str]


class PredictRequest(BaseModel):
    """Vertex AI's `POST /predict`: `instances`, each a chat completion request marked
    `"@requestFormat": "chatCompletions"` (the one format served), none streamed."""

    model_config = ConfigDict(extra="forbid")
    instances: list[dict[str, Any]] = Field(min_length=1, max_length=64)
    parameters: dict[str, Any] | None = None  # Vertex's per-call parameters: only an empty one

    @field_validator("parameters")
    @classmethod
    def _no_parameters(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v:
            raise ValueError("not read by Llamba: put each request's fields in its instance")
        return v

    def chat_requests(self) -> list[ChatCompletionRequest]:
        """Each instance as a ChatCompletionRequest; a bad one is a 400 naming `instances.<i>...`."""
        requests = []
        for i, instance in enumerate(self.instances):
            fields = dict(instance)
            kind = fields.pop("@requestFormat", None)
            if kind != "chatCompletions":
                raise errors.invalid_request(
                    f"'instances.{i}.@requestFormat' must be \"chatCompletions\", got {kind!r}"
                )
            if fields.get("stream"):
                raise errors.invalid_request(f"'instances.{i}.stream': predictions are not streamed")
            try:
                requests.append(ChatCompletionRequest.model_validate(fields))
            except ValidationError as exc:
                err = errors.from_validation(exc)
                raise errors.invalid_request(f"instances.{i}: {err.message}") from None
        return requests
