"""Ollama's /api/embed and /api/embeddings on an encoder (all-MiniLM-L6-v2, --embedding): the vectors
are /v1/embeddings' (L2-normalised), `dimensions` cuts and normalises again, `truncate` false refuses a
long input, the older route gives the pooled vector unnormalised; the encoder's capabilities."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import ollama
import pytest

from engine.model_files import MINILM
from tests.test_encoders_server import embedding_server

NAME = MINILM.name
TEXTS = ["The cat sat on the mat.", "Quantum chromodynamics"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    for proc in embedding_server(MINILM.name, MINILM.filename):
        yield proc.base_url


def test_embed_is_the_openai_routes_vectors(server: str) -> None:
    client = ollama.Client(host=server, timeout=120)
    reply = client.embed(model=NAME, input=TEXTS)
    openai = httpx.post(server + "/v1/embeddings", json={"input": TEXTS}, timeout=120).json()
    expected = np.array([item["embedding"] for item in openai["data"]])
    assert np.allclose(np.array(reply.embeddings), expected, atol=1e-6)
    assert reply.prompt_eval_count == openai["usage"]["prompt_tokens"] and reply.total_duration > 0
    one = client.embed(model=f"{NAME}:latest", input=TEXTS[0])
    assert np.allclose(one.embeddings[0], expected[0], atol=1e-6)
    cut = np.array(client.embed(model=NAME, input=TEXTS[0], dimensions=64).embeddings[0])
    assert cut.shape == (64,) and abs(np.linalg.norm(cut) - 1) < 1e-5
    assert np.allclose(cut, expected[0][:64] / np.linalg.norm(expected[0][:64]), atol=1e-5)


def test_truncation_and_the_older_route(server: str) -> None:
    long_text = "word " * 3000  # past the 1024-token slot
    http = httpx.Client(base_url=server, timeout=120)
    assert http.post("/api/embed", json={"model": NAME, "input": long_text}).status_code == 200
    refused = http.post("/api/embed", json={"model": NAME, "input": long_text, "truncate": False})
    assert refused.status_code == 400 and "exceeds the context length" in refused.json()["error"]
    assert http.post("/api/embed", json={"model": NAME, "input": [1, 2]}).status_code == 400
    old = np.array(http.post("/api/embeddings", json={"model": NAME, "prompt": TEXTS[0]}).json()["embedding"])
    new = np.array(http.post("/api/embed", json={"model": NAME, "input": TEXTS[0]}).json()["embeddings"][0])
    assert np.allclose(old / np.linalg.norm(old), new, atol=1e-5)
    assert http.post("/api/embeddings", json={"model": NAME}).json() == {"embedding": []}


def test_an_encoders_capabilities_and_no_chat(server: str) -> None:
    client = ollama.Client(host=server, timeout=120)
    assert client.show(NAME).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as caught:
        client.chat(model=NAME, messages=[{"role": "user", "content": "Hi"}], stream=False)
    assert caught.value.status_code == 400 and "encoder" in caught.value.error
