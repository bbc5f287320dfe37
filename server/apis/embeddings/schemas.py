"""The embedding and rerank bodies (llama-server's and OpenAI's shapes); bad input is a 400 naming the field.

An embedding input is what llama-server's tokenize_input_prompts takes: a string, a list of token ids,
or a list whose items are strings, token lists or mixed lists of both (one embedding per item); an item
may also be OpenAI-style content, `{"content": [{"type": "text", "text": ...}, ...]}`, its texts joined.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

# One prompt: a text, or token ids with texts mixed in (llama-server's mixed prompt).
Piece = StrictStr | StrictInt
Prompt = StrictStr | list[Piece]
MEDIA_PARTS = ("image_url", "input_audio", "input_video")


class ContentInput(BaseModel):
    """One input as content parts (llama-server's tokenize_oai_content_array): the texts, joined, are
    the prompt; a media part (a model with --mmproj) stands at its place in it (server/chat/media.py)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    content: list[dict[str, Any]]

    @field_validator("content")
    @classmethod
    def _text_parts(cls, parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for part in parts:
            kind = part.get("type")
            if kind in MEDIA_PARTS:
                continue
            if kind != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                raise ValueError('each content part must be {"type": "text", "text": "..."}')
        return parts

    @property
    def has_media(self) -> bool:
        return any(part.get("type") in MEDIA_PARTS for part in self.content)

    @property
    def text(self) -> str:
        return "".join(part["text"] for part in self.content)


class EmbeddingsBody(BaseModel):
    """POST /embedding, /embeddings (llama-server's `content`) and /v1/embeddings (OpenAI's `input`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    input: Prompt | ContentInput | list[Prompt | ContentInput] | None = None
    content: Prompt | ContentInput | list[Prompt | ContentInput] | None = None
    encoding_format: Literal["float", "base64"] = "float"
    embd_normalize: StrictInt | None = Field(default=None, ge=-1)
    # OpenAI's Matryoshka truncation (nomic-embed v1.5, text-embedding-3): the first `dimensions` values
    # of the pooled vector, normalised again. llama-server ignores the field; the model's width bounds it.
    dimensions: StrictInt | None = Field(default=None, ge=1)
    model: StrictStr | None = None  # echoed back, as llama-server does
    user: StrictStr | None = None  # OpenAI's end-user id: metadata

    @model_validator(mode="after")
    def _one_input(self) -> EmbeddingsBody:
        if self.input is None and self.content is None:
            raise ValueError('"input" or "content" must be provided')
        if self.input is not None and self.content is not None:
            raise ValueError('give "input" or "content", not both')
        return self

    def prompts(self) -> list[str | list[Piece] | ContentInput]:
        """One entry per embedding wanted: a list of ids (or mixed) is one prompt, other lists several;
        content with media stays content (its media are encoded by the route)."""
        value = self.input if self.input is not None else self.content
        assert value is not None
        if isinstance(value, str):
            return [value]
        if isinstance(value, ContentInput):
            return [value if value.has_media else value.text]
        if value and all(isinstance(v, int) for v in value) or not value:
            return [value]  # type: ignore[list-item]
        return [_prompt_of(v) for v in value]  # type: ignore[arg-type]


def _prompt_of(value: str | list[Piece] | ContentInput | int) -> str | list[Piece] | ContentInput:
    if isinstance(value, ContentInput):
        return value if value.has_media else value.text
    return value if isinstance(value, (str, list)) else [value]


class RerankDocument(BaseModel):
    """A document as an object (Jina's and Cohere's `{"text": ...}`): its text is what is ranked."""

    model_config = ConfigDict(extra="ignore", strict=True)

    text: StrictStr


class RerankBody(BaseModel):
    """POST /rerank, /reranking, /v1/rerank, /v1/reranking: Jina's shape (`documents`, results with
    `relevance_score`) or TEI's (`texts`, a bare list with `score`; `return_text` adds each text)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    query: StrictStr
    documents: list[StrictStr | RerankDocument] | None = None
    texts: list[StrictStr] | None = None
    top_n: StrictInt | None = Field(default=None, ge=0)
    return_text: bool = False
    model: StrictStr | None = None

    @model_validator(mode="after")
    def _documents(self) -> RerankBody:
        docs = self.documents if self.documents is not None else self.texts
        if not docs:
            raise ValueError('"documents" must be a non-empty string array')
        if self.documents is not None and self.texts is not None:
            raise ValueError('give "documents" or "texts", not both')
        return self

    @property
    def tei(self) -> bool:
        return self.texts is not None

    @property
    def docs(self) -> list[str]:
        docs = self.documents if self.documents is not None else self.texts or []
        return [d.text if isinstance(d, RerankDocument) else d for d in docs]
