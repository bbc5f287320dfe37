"""Ollama's request bodies (its api/types.go), validated at the boundary: /api/chat, /api/generate,
/api/embed, /api/embeddings and /api/show. Unknown fields are ignored, as Go's JSON decoding ignores
them; a value of the wrong type is a 400 naming the field. `stream` absent means a stream (Ollama's
default); `options` is read by server/apis/ollama/options.py; `keep_alive` is accepted (a single-model
server cannot unload its model)."""

from __future__ import annotations

import base64
import binascii
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictInt, StrictStr

# `think`: a switch, or a thinking level (its api.ThinkValue)
ThinkLevel = Literal["low", "medium", "high", "max"]
Think = StrictBool | ThinkLevel
# `format`: "json", or a JSON schema; "" and null mean none (another string: a 400 in Ollama's words,
# server/apis/ollama/translate.py)
Format = StrictStr | dict[str, Any]
# `keep_alive`: a Go duration ("5m") or a number of seconds
KeepAlive = StrictStr | int | float


def _base64_image(value: Any) -> str:
    """An image as Ollama's []byte takes it: base64 text (decoded here to check it)."""
    if not isinstance(value, str):
        raise ValueError("an image must be base64 text")
    try:
        base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("an image must be base64 text") from None
    return value


Image = Annotated[str, BeforeValidator(_base64_image)]


def _lower(value: Any) -> Any:
    return value.lower() if isinstance(value, str) else value  # Ollama lower-cases a message's role


class OllamaFields(BaseModel):
    """What every Ollama body has: the model's name, `options`, `keep_alive`."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive | None = None


class OllamaFunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    index: StrictInt | None = None
    name: StrictStr
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object, not OpenAI's JSON text


class OllamaToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: StrictStr | None = None
    function: OllamaFunctionCall


class OllamaMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Annotated[Literal["system", "user", "assistant", "tool"], BeforeValidator(_lower)]
    content: StrictStr = ""
    thinking: StrictStr | None = None
    images: list[Image] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: StrictStr | None = None  # a tool message: the tool whose result it holds
    tool_call_id: StrictStr | None = None


class OllamaGenerationFields(OllamaFields):
    """The fields /api/chat and /api/generate share."""

    stream: StrictBool | None = None  # absent: a stream
    format: Format | None = None
    think: Think | None = None
    truncate: StrictBool | None = None
    shift: StrictBool | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt = Field(default=0, ge=0, le=20)

    @property
    def streams(self) -> bool:
        return self.stream is not False


class OllamaChatRequest(OllamaGenerationFields):
    """POST /api/chat."""

    messages: list[OllamaMessage] = Field(default_factory=list)
    tools: list[dict[str, Any]] | None = None
    # Llamba's extension (Ollama has none): the OpenAI route's tool_choice ("auto", "none", "required",
    # or a named function), for a model that writes its calls only when held to them
    tool_choice: Literal["auto", "none", "required"] | dict[str, Any] | None = None


class OllamaGenerateRequest(OllamaGenerationFields):
    """POST /api/generate."""

    prompt: StrictStr = ""
    suffix: StrictStr = ""
    system: StrictStr = ""
    template: StrictStr = ""
    context: list[StrictInt] | None = None
    raw: StrictBool = False
    images: list[Image] | None = None


class OllamaEmbedRequest(OllamaFields):
    """POST /api/embed: one text or a list of them."""

    input: StrictStr | list[StrictStr] | None = None
    truncate: StrictBool | None = None
    dimensions: StrictInt | None = Field(default=None, ge=0)

    def texts(self) -> list[str]:
        if self.input is None or self.input == "":
            return []
        return [self.input] if isinstance(self.input, str) else list(self.input)


class OllamaEmbeddingsRequest(OllamaFields):
    """POST /api/embeddings (the older route): one prompt."""

    prompt: StrictStr = ""


class OllamaShowRequest(BaseModel):
    """POST /api/show: the model by `model` (or the older `name`)."""

    model_config = ConfigDict(extra="ignore")

    model: StrictStr = ""
    name: StrictStr = ""
    verbose: StrictBool = False
    system: StrictStr = ""
    template: StrictStr = ""
    options: dict[str, Any] | None = None

    @property
    def asked(self) -> str:
        return self.model or self.name
