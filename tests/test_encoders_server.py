"""A real llamba-server on an encoder: all-MiniLM-L6-v2 with --embedding (and the synthetic bge-style
reranker with --reranking), against llama.cpp's vectors and scores in tests/golden/encoders.json.

The embedding routes answer as on any model (/v1/embeddings, /embedding, every embd_normalize); a
generation (chat, completion, streamed or not) is refused before any byte with a 400 naming the reason
(llama-server lets it reach a slot and answers 500, "the current context does not support logits
computation"); an input longer than one batch is an error, as llama-server's ("too large to process").
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from engine.model_files import MINILM, NOMIC_EMBED, SMOLLM2, models_dir
from server.apis.embeddings.routes import normalize
from tests.conftest import load_golden, require
from tests.server_process import ServerProcess
from tests.synthetic_encoders import vocabularies, write_encoder
from tests.test_encoders import BARS, cosine, vectors

GOLDEN = load_golden("encoders")
CASE = GOLDEN["real"][MINILM.name]
BAR = BARS[MINILM.filename]  # tests/test_encoders.py says why MiniLM's is 0.9998


def embedding_server(name: str, filename: str) -> Iterator[ServerProcess]:
    if not (models_dir() / filename).is_file():
        require(f"{filename} is not in {models_dir()} (`make models` fetches it)")
    proc = ServerProcess("-m", name, "--embedding", "-np", "4", "-c", "2048")
    yield proc.wait_healthy()
    proc.stop()


@pytest.fixture(scope="module")
def minilm() -> Iterator[ServerProcess]:
    yield from embedding_server(MINILM.name, MINILM.filename)


@pytest.fixture(scope="module", params=[MINILM.name, NOMIC_EMBED.name])
def real_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, ServerProcess]]:
    spec = {MINILM.name: MINILM, NOMIC_EMBED.name: NOMIC_EMBED}[request.param]
    for proc in embedding_server(spec.name, spec.filename):
        yield spec.name, proc


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def test_v1_embeddings_are_llama_cpps_normalised(minilm: ServerProcess) -> None:
    texts = GOLDEN["sentences"][:40]
    r = post(minilm, "/v1/embeddings", {"input": texts, "model": "minilm"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["prompt_tokens"] == sum(len(t) for t in CASE["tokens"][:40])
    theirs = vectors(CASE, "vectors", "<f2")[:40]
    for item, want in zip(body["data"], theirs, strict=True):
        ours = np.array(item["embedding"])
        assert abs(np.linalg.norm(ours) - 1) < 1e-5  # embd_normalize 2, the default
        assert cosine(ours, want) >= BAR


def test_openai_sdk_float_and_base64_agree_and_dimensions_cut(real_server: tuple[str, ServerProcess]) -> None:
    """The openai SDK's embeddings.create on both real files: its default (base64, decoded by the SDK)
    equals encoding_format float bit for bit, both are llama.cpp's vectors, and `dimensions` is the
    first n values normalised again (Matryoshka, as nomic-embed v1.5 is trained for)."""
    name, server = real_server
    case = GOLDEN["real"][name]
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
    texts = GOLDEN["sentences"][10:14]
    as_base64 = client.embeddings.create(model=name, input=texts)
    as_float = client.embeddings.create(model=name, input=texts, encoding_format="float")
    theirs = vectors(case, "vectors", "<f2")[10:14]
    assert as_base64.usage.prompt_tokens == sum(len(t) for t in case["tokens"][10:14])
    for a, b, want in zip(as_base64.data, as_float.data, theirs, strict=True):
        assert np.array_equal(np.array(a.embedding, np.float32), np.array(b.embedding, np.float32))
        assert cosine(np.array(b.embedding), want) >= BARS[case["file"]]
    cut = client.embeddings.create(model=name, input=texts, dimensions=64, encoding_format="float")
    for item, full in zip(cut.data, as_float.data, strict=True):
        ours = np.array(item.embedding, np.float32)
        assert len(ours) == 64 and abs(np.linalg.norm(ours) - 1) < 1e-5
        np.testing.assert_allclose(ours, normalize(np.array(full.embedding[:64], np.float32), 2), rtol=1e-5)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=name, input=texts, dimensions=100_000)


@pytest.mark.parametrize(
    "body",
    [
        {"input": []},
        {"input": [1.5]},
        {"input": {"text": "a"}},
        {"input": ["fine", None]},
        {"input": "x", "dimensions": 0},
        {"input": "x", "encoding_format": "int8"},
        {"input": "word " * 600},
    ],
)
def test_bad_inputs_are_a_4xx_and_the_server_keeps_serving(minilm: ServerProcess, body: dict) -> None:
    r = post(minilm, "/v1/embeddings", body)
    assert 400 <= r.status_code < 500, (body, r.status_code, r.text)
    assert r.json()["error"]["message"]
    ok = post(minilm, "/v1/embeddings", {"input": GOLDEN["sentences"][0]})
    assert ok.status_code == 200 and len(ok.json()["data"][0]["embedding"]) == 384


def test_native_embedding_route_and_every_normalisation(minilm: ServerProcess) -> None:
    raw_want = vectors(CASE, "vectors", "<f2")[3]
    r = post(minilm, "/embedding", {"content": GOLDEN["sentences"][3], "embd_normalize": -1})
    assert r.status_code == 200, r.text
    ((raw,),) = [item["embedding"] for item in r.json()]
    raw = np.array(raw)
    assert cosine(raw, raw_want) >= BAR and abs(np.linalg.norm(raw) / np.linalg.norm(raw_want) - 1) < 1e-3
    for norm, check in (
        (0, lambda v: abs(np.abs(v).max() - 32760) < 0.1),
        (1, lambda v: abs(np.abs(v).sum() - 1) < 1e-5),
        (2, lambda v: abs(np.linalg.norm(v) - 1) < 1e-5),
        (3, lambda v: abs((np.abs(v) ** 3).sum() - 1) < 1e-5),
    ):
        r = post(minilm, "/embedding", {"content": GOLDEN["sentences"][3], "embd_normalize": norm})
        ((vector,),) = [item["embedding"] for item in r.json()]
        assert check(np.array(vector)) and cosine(np.array(vector), raw_want) >= BAR, norm


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
        ("/completion", {"prompt": "hi"}),
        ("/v1/completions", {"prompt": "hi", "stream": True}),
    ],
)
def test_a_generation_is_refused_before_any_byte(minilm: ServerProcess, path: str, body: dict) -> None:
    r = post(minilm, path, body)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    assert "does not support logits computation" in r.json()["error"]["message"]


def test_an_input_longer_than_a_batch_is_an_error(minilm: ServerProcess) -> None:
    r = post(minilm, "/v1/embeddings", {"input": "word " * 600})
    assert r.status_code >= 400
    assert "too large to process" in r.text or "exceed" in r.text


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = write_encoder("bge-reranker", tmp_path_factory.mktemp("bge") / "bge-reranker.gguf", vocabularies())
    proc = ServerProcess("-m", str(path), "--reranking", "-np", "2", "-c", "1024")
    yield proc.wait_healthy()
    proc.stop()


def test_rerank_on_an_encoder_as_llama_cpp(reranker: ServerProcess) -> None:
    rerank = GOLDEN["synthetic"]["bge-reranker"]["rerank"]
    docs = [d["document"] for d in rerank["documents"]]
    r = post(reranker, "/v1/rerank", {"query": rerank["query"], "documents": docs})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    theirs = [d["scores"][0] for d in rerank["documents"]]
    assert [item["index"] for item in results] == np.argsort(theirs)[::-1].tolist()
    for item in results:
        assert abs(item["relevance_score"] - theirs[item["index"]]) < 2e-4
    assert r.json()["usage"]["prompt_tokens"] == sum(len(d["tokens"]) for d in rerank["documents"])


def test_rerank_documents_as_objects_top_n_and_text(reranker: ServerProcess) -> None:
    rerank = GOLDEN["synthetic"]["bge-reranker"]["rerank"]
    docs = [d["document"] for d in rerank["documents"]]
    body = {"query": rerank["query"], "documents": [{"text": d} for d in docs], "top_n": 2}
    r = post(reranker, "/rerank", body | {"return_text": True})
    assert r.status_code == 200, r.text
    best = np.argsort([d["scores"][0] for d in rerank["documents"]])[::-1][:2].tolist()
    assert [(item["index"], item["text"]) for item in r.json()["results"]] == [(i, docs[i]) for i in best]
    assert post(reranker, "/rerank", {"query": "q", "documents": []}).status_code == 400
    assert post(reranker, "/rerank", {"query": "q", "documents": [{"title": "no text"}]}).status_code == 400


def test_encoder_file_identity(reranker: ServerProcess) -> None:
    props = httpx.get(reranker.base_url + "/props", timeout=30).json()
    assert Path(props["model_path"]).name == "bge-reranker.gguf"


def test_a_router_serves_an_embedder_beside_a_chat_model(tmp_path: Path) -> None:
    """One router, two children: `model` picks the catalogue's MiniLM (with --embedding) or SmolLM2."""
    for spec in (MINILM, SMOLLM2):
        if not (models_dir() / spec.filename).is_file():
            require(f"{spec.filename} is not in {models_dir()} (`make models` fetches it)")
    preset = tmp_path / "models.ini"
    preset.write_text(f"[embed]\nmodel = {MINILM.name}\nembedding = true\n[chat]\nmodel = {SMOLLM2.name}\n")
    router = ServerProcess("--models-preset", str(preset), "--models-max", "2").wait_healthy()
    try:
        body = {"model": "embed", "input": GOLDEN["sentences"][:2]}
        r = httpx.post(router.base_url + "/v1/embeddings", json=body, timeout=300)
        assert r.status_code == 200, r.text
        theirs = vectors(CASE, "vectors", "<f2")[:2]
        for item, want in zip(r.json()["data"], theirs, strict=True):
            assert cosine(np.array(item["embedding"]), want) >= BAR
        chat = {"model": "chat", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
        r = httpx.post(router.base_url + "/v1/chat/completions", json=chat, timeout=300)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text
        r = httpx.post(router.base_url + "/v1/chat/completions", json=chat | {"model": "embed"}, timeout=60)
        assert r.status_code == 400 and "logits" in r.text
    finally:
        router.stop()
