"""/api/embed and /api/embeddings on the embeddings path (server/apis/embeddings: --embedding, the
engine's pooled vectors).

/api/embed: each text tokenized as llama-server's embeddings tokenize it (special tokens, BOS/EOS), cut
to the slot's context unless `truncate` is false (then a longer text is Ollama's 400), every input in
the batch at once; each vector L2-normalised, then cut to `dimensions` and normalised again, as Ollama
does. /api/embeddings (the older route): one prompt's vector as the model pools it, not normalised
(Ollama's own behaviour there).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.apis.embeddings.routes import normalize
from server.apis.ollama.options import read_options
from server.apis.ollama.replies import Clock
from server.apis.ollama.schemas import OllamaEmbeddingsRequest, OllamaEmbedRequest
from server.http import errors
from server.model.host import ModelHost

EUCLIDEAN, NONE = 2, -1  # llama.cpp's embd_normalize values


def require_embeddings(model: ModelHost) -> None:
    if not model.settings.embedding:
        raise errors.not_supported("This server does not support embeddings. Start it with `--embeddings`")
    model.require_ready()
    if model.client.pooling == "none":
        raise errors.invalid_request("this server's pooling is none: Ollama's embeddings are pooled vectors")


async def embed_reply(model: ModelHost, body: OllamaEmbedRequest, clock: Clock) -> Any:
    read_options(body.options)  # checked; nothing in them changes an embedding
    texts = body.texts()
    require_embeddings(model)
    if not texts:
        return {"model": body.model, "embeddings": []}
    prompts = [await tokens(model, text, body.truncate is not False) for text in texts]
    clock.ready()
    events = await model.client.embed(prompts)
    vectors = []
    for event in events:
        assert event.embedding is not None
        vector = normalize(event.embedding.reshape(-1), EUCLIDEAN)
        if body.dimensions and body.dimensions < len(vector):
            vector = normalize(vector[: body.dimensions], EUCLIDEAN)
        vectors.append(vector.tolist())
    metrics = clock.metrics(sum(len(p) for p in prompts), None)
    return {"model": body.model, "embeddings": vectors} | {
        k: metrics[k] for k in ("total_duration", "load_duration", "prompt_eval_count")
    }


async def embeddings_reply(model: ModelHost, body: OllamaEmbeddingsRequest) -> Any:
    read_options(body.options)
    require_embeddings(model)
    if not body.prompt:
        return {"embedding": []}
    (event,) = await model.client.embed([await tokens(model, body.prompt, truncate=True)])
    assert event.embedding is not None
    vector: np.ndarray = normalize(event.embedding.reshape(-1), NONE)
    return {"embedding": vector.astype(np.float64).tolist()}


async def tokens(model: ModelHost, text: str, truncate: bool) -> list[int]:
    """A text's tokens, cut to the slot's context (the last one, an EOS the model adds, kept) or, without
    `truncate`, a 400 when longer."""
    builder = model.prompts
    ids = await builder.tokenize(text, True, True)
    limit = builder.n_ctx_slot
    if not ids:
        raise errors.invalid_request("Input content cannot be empty")
    if len(ids) <= limit:
        return ids
    if not truncate:
        raise errors.invalid_request("the input length exceeds the context length")
    if builder.tokenizer.add_eos:
        return ids[: limit - 1] + ids[-1:]
    return ids[:limit]
