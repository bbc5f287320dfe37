"""Embeddings and rerank: /embedding, /embeddings, /v1/embeddings; /rerank, /reranking, /v1/rerank(ing).

As llama-server: the routes answer only when the server runs with --embedding (rerank: --reranking,
pooling rank), else 501 not_supported_error. Each input is one engine request (`EngineClient.embed`),
all of them in the continuous batch at once. Pooled vectors are normalised per `embd_normalize`
(llama.cpp's common_embd_normalize); pooling none returns every token's vector as it is.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from quart import Blueprint

from engine.api import TokenEvent
from server.apis.embeddings.schemas import ContentInput, EmbeddingsBody, Piece, RerankBody
from server.chat.media import MEDIA_MARKER, content_media, media_sources
from server.http import errors
from server.http.request_body import json_body
from server.model.host import ModelHost, current_model
from server.model.media import MediaPrompt, media_tokens
from server.model.prompts import Media, PromptBuilder

bp = Blueprint("embeddings", __name__)


def normalize(vector: np.ndarray, embd_normalize: int) -> np.ndarray:
    """llama.cpp's common_embd_normalize: -1 none, 0 max absolute scaled to int16's range, 2 euclidean,
    any other p the p-norm (1: taxicab). The sum in double precision, as llama.cpp takes it."""
    x = vector.astype(np.float64)
    if embd_normalize == -1:
        total = 1.0
    elif embd_normalize == 0:
        total = float(np.abs(x).max(initial=0.0)) / 32760.0
    elif embd_normalize == 2:
        total = float(np.sqrt(np.sum(x * x)))
    else:
        total = float(np.sum(np.abs(x) ** embd_normalize) ** (1.0 / embd_normalize))
    scale = 1.0 / total if total > 0.0 else 0.0
    return (vector * np.float32(scale)).astype(np.float32)


async def _input(model: ModelHost, prompt: str | list[Piece] | ContentInput) -> tuple[list[int], Media]:
    """One input's tokens, and its media chunks by marker (content with images or audio: each medium
    encoded, placed at its part as mtmd places it)."""
    builder = model.prompts
    if not isinstance(prompt, ContentInput):
        return await _tokens(builder, prompt), {}
    encoder = model.media
    modalities = encoder.modalities if encoder is not None else frozenset()
    text, files = await content_media(prompt.content, modalities, media_sources(model.settings))
    assert encoder is not None  # content_media refuses media the model cannot read
    media = MediaPrompt(MEDIA_MARKER, [await encoder.medium(f.kind, f.data) for f in files])
    tokens = await media_tokens(builder.tokenize, builder.tokenizer, text, media)
    if len(tokens) > builder.n_ctx_slot:
        raise errors.exceed_context(len(tokens), builder.n_ctx_slot)
    return tokens, {chunk.marker: chunk for chunk in media.chunks}


async def _tokens(builder: PromptBuilder, prompt: str | list[Piece]) -> list[int]:
    """One prompt's tokens as llama-server's tokenize_input_subprompt makes them: texts with special
    tokens parsed and the vocabulary's BOS/EOS added, token ids as given."""
    if isinstance(prompt, str):
        tokens = await builder.tokenize(prompt, True, True)
    else:
        tokens = []
        for piece in prompt:
            tokens += [piece] if isinstance(piece, int) else await builder.tokenize(piece, False, True)
        builder.check_tokens(tokens)
    if not tokens:
        raise errors.invalid_request("Input content cannot be empty")
    if len(tokens) > builder.n_ctx_slot:
        raise errors.exceed_context(len(tokens), builder.n_ctx_slot)
    return tokens


def _require_embeddings(model: ModelHost) -> None:
    if not model.settings.embedding:
        raise errors.not_supported("This server does not support embeddings. Start it with `--embeddings`")
    model.require_ready()


def _vectors(event: TokenEvent, pooled: bool, norm: int, dimensions: int | None) -> list[np.ndarray]:
    """An answer as llama-server's `embedding`: one normalised vector (its first `dimensions` values,
    normalised after the cut), or (pooling none) every token's."""
    assert event.embedding is not None
    if pooled:
        return [normalize(event.embedding.reshape(-1)[:dimensions], norm)]
    return list(event.embedding)


def _check_dimensions(dimensions: int | None, n_embd: int) -> None:
    if dimensions is not None and dimensions > n_embd:
        raise errors.invalid_request(f"dimensions must be at most the model's {n_embd}, not {dimensions}")


@bp.post("/embedding")
@bp.post("/embeddings")
async def embeddings_native() -> Any:
    return await _embeddings(oai=False)


@bp.post("/v1/embeddings")
async def embeddings_oai() -> Any:
    return await _embeddings(oai=True)


async def _embeddings(oai: bool) -> Any:
    model = current_model()
    _require_embeddings(model)
    body = EmbeddingsBody.model_validate(await json_body())
    client = model.client
    pooled = client.pooling != "none"
    if oai and body.input is not None and not pooled:
        raise errors.invalid_request(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type"
        )
    _check_dimensions(body.dimensions, model.model_info().n_embd)
    model.require_ready()  # 503 while the model loads
    inputs = [await _input(model, p) for p in body.prompts()]
    prompts = [tokens for tokens, _ in inputs]
    norm = model.settings.embd_normalize if body.embd_normalize is None else body.embd_normalize
    events = await client.embed(prompts, [media for _, media in inputs])
    vectors = [_vectors(e, pooled, norm, body.dimensions) for e in events]
    if not oai or body.input is None:  # llama-server: `content` is answered in its own shape
        return [{"index": i, "embedding": [v.tolist() for v in vs]} for i, vs in enumerate(vectors)]
    n_tokens = sum(len(p) for p in prompts)
    return {
        "model": body.model or model.settings.model_alias,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "data": [_oai_item(i, vs[0], body.encoding_format) for i, vs in enumerate(vectors)],
    }


def _oai_item(index: int, vector: np.ndarray, encoding: str) -> dict[str, Any]:
    if encoding == "base64":
        raw = base64.b64encode(vector.astype("<f4").tobytes()).decode()
        return {"embedding": raw, "index": index, "object": "embedding", "encoding_format": "base64"}
    return {"embedding": vector.tolist(), "index": index, "object": "embedding"}


@bp.post("/rerank")
@bp.post("/reranking")
@bp.post("/v1/rerank")
@bp.post("/v1/reranking")
async def rerank() -> Any:
    model = current_model()
    if not model.settings.embedding or model.settings.pooling != "rank":
        raise errors.not_supported("This server does not support reranking. Start it with `--reranking`")
    model.require_ready()
    body = RerankBody.model_validate(await json_body())
    docs = body.docs
    builder = model.prompts
    prompts = [await builder.rerank_tokens(body.query, doc) for doc in docs]
    for tokens in prompts:
        if len(tokens) > builder.n_ctx_slot:
            raise errors.exceed_context(len(tokens), builder.n_ctx_slot)
    events = await model.client.embed(prompts)
    label = "score" if body.tei else "relevance_score"
    results = []
    for index, event in enumerate(events):
        assert event.embedding is not None
        item: dict[str, Any] = {"index": index, label: float(event.embedding.reshape(-1)[0])}
        if body.return_text:
            item["text"] = docs[index]
        results.append(item)
    results.sort(key=lambda r: -r[label])  # stable: equal scores keep the documents' order
    results = results[: len(docs) if body.top_n is None else body.top_n]
    if body.tei:
        return results
    n_tokens = sum(len(p) for p in prompts)
    return {
        "model": body.model or model.settings.model_alias,
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }
