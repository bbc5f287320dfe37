"""The embedding and rerank routes end to end: real servers (--embedding, --reranking), httpx and the
`openai` SDK. llama.cpp's vectors and scores are tests/golden/embeddings.json."""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Iterator

import httpx
import numpy as np
import openai
import pytest

from engine.model_files import resolve
from tests.conftest import load_golden
from tests.server_process import ServerProcess
from tests.synthetic_reranker import write_reranker
from tests.test_embeddings import cosine, golden_vectors

GOLDEN = load_golden("embeddings")
# Texts of many lengths (the longest over one 512-token batch, so its prompt runs in chunks).
TEXTS = [f"Sentence number {i}: " + "the cat sat on the mat. " * (i % 7 + 1) for i in range(62)] + [
    "A long document. " + "Embeddings of long inputs run in chunks. " * 90,
    "x",
]


@pytest.fixture(scope="module")
def mean_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "--embedding", "--pooling", "mean", "-np", "4", "-c", "4096")
    yield proc.wait_healthy()
    proc.stop()


@pytest.fixture(scope="module")
def none_server() -> Iterator[ServerProcess]:
    proc = ServerProcess("-m", "smollm2", "--embeddings", "-np", "1", "-c", "1024")  # the model's pooling
    yield proc.wait_healthy()
    proc.stop()


@pytest.fixture(scope="module")
def rerank_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    path = write_reranker(tmp_path_factory.mktemp("reranker") / "reranker.gguf", resolve("smollm2"))
    proc = ServerProcess("-m", str(path), "--reranking", "-np", "2", "-c", "1024")
    yield proc.wait_healthy()
    proc.stop()


def post(server: ServerProcess, path: str, body: object) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=120)


def embeddings(server: ServerProcess, inputs: object, **fields: object) -> list[list[float]]:
    r = post(server, "/v1/embeddings", {"input": inputs, **fields})
    assert r.status_code == 200, r.text
    return [item["embedding"] for item in r.json()["data"]]


def test_mean_pooling_matches_llama_cpp_normalised(mean_server: ServerProcess) -> None:
    rows = GOLDEN["models"]["smollm2"]["poolings"]["mean"]
    r = post(mean_server, "/v1/embeddings", {"input": [row["text"] for row in rows], "model": "m"})
    body = r.json()
    assert body["object"] == "list" and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": sum(len(row["tokens"]) for row in rows)} | {
        "total_tokens": sum(len(row["tokens"]) for row in rows)
    }
    for item, row in zip(body["data"], rows, strict=True):
        vector = np.array(item["embedding"])
        assert item["object"] == "embedding" and abs(np.linalg.norm(vector) - 1) < 1e-5  # embd_normalize 2
        assert cosine(vector, golden_vectors(row)) >= 0.999


def test_openai_sdk_float_and_base64(mean_server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=mean_server.base_url + "/v1", api_key="none")
    as_float = client.embeddings.create(model="x", input=["hello", "world"], encoding_format="float")
    as_base64 = client.embeddings.create(model="x", input=["hello", "world"], encoding_format="base64")
    default = client.embeddings.create(model="x", input="hello")  # the SDK asks for base64 and decodes
    assert len(as_float.data) == 2 and len(as_float.data[0].embedding) == 576
    for a, b in zip(as_float.data, as_base64.data, strict=True):  # asked for, base64 stays a string
        assert isinstance(b.embedding, str)
        assert np.array_equal(np.float32(a.embedding), np.frombuffer(base64.b64decode(b.embedding), "<f4"))
    assert np.array_equal(np.float32(default.data[0].embedding), np.float32(as_float.data[0].embedding))
    raw = post(mean_server, "/v1/embeddings", {"input": "hello", "encoding_format": "base64"}).json()
    item = raw["data"][0]
    assert item["encoding_format"] == "base64"
    assert np.array_equal(
        np.frombuffer(base64.b64decode(item["embedding"]), "<f4"), as_float.data[0].embedding
    )


def test_input_shapes(mean_server: ServerProcess) -> None:
    tokens = httpx.post(mean_server.base_url + "/tokenize", json={"content": "the cat"}).json()["tokens"]
    text, ids = embeddings(mean_server, "the cat"), embeddings(mean_server, tokens)
    assert text == ids and len(text) == 1
    pair = embeddings(mean_server, [tokens, tokens + tokens])
    assert pair[0] == text[0] and pair[1] != text[0]
    mixed = embeddings(mean_server, [["the", tokens[1]], "the cat"])
    assert mixed[1] == text[0] and len(mixed) == 2
    native = post(mean_server, "/embedding", {"content": ["the cat", "dog"]}).json()
    assert [item["index"] for item in native] == [0, 1]
    assert native[0]["embedding"] == [text[0]]  # llama-server's shape: a list holding the pooled vector


def test_normalisations(mean_server: ServerProcess) -> None:
    raw = np.array(embeddings(mean_server, "the cat", embd_normalize=-1)[0])
    assert np.linalg.norm(raw) > 2
    by_max = np.array(embeddings(mean_server, "the cat", embd_normalize=0)[0])
    np.testing.assert_allclose(np.abs(by_max).max(), 32760, rtol=1e-6)
    taxicab = np.array(embeddings(mean_server, "the cat", embd_normalize=1)[0])
    np.testing.assert_allclose(np.abs(taxicab).sum(), 1, rtol=1e-5)
    p3 = np.array(embeddings(mean_server, "the cat", embd_normalize=3)[0])
    np.testing.assert_allclose((np.abs(p3) ** 3).sum(), 1, rtol=1e-5)
    np.testing.assert_allclose(raw / np.linalg.norm(raw), embeddings(mean_server, "the cat")[0], rtol=1e-5)


def test_batched_and_concurrent_equal_one_by_one(mean_server: ServerProcess) -> None:
    alone = [embeddings(mean_server, text)[0] for text in TEXTS]
    assert embeddings(mean_server, TEXTS) == alone  # 64 inputs in one request: bitwise the same
    chosen = list(range(0, 64, 4))
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda i: embeddings(mean_server, [TEXTS[i], TEXTS[63 - i]]), chosen))
    assert together == [[alone[i], alone[63 - i]] for i in chosen]


def test_pooling_none_gives_every_tokens_vector(none_server: ServerProcess) -> None:
    rows = GOLDEN["models"]["smollm2"]["poolings"]["none"]
    body = post(none_server, "/embedding", {"content": rows[0]["text"]}).json()
    vectors = np.array(body[0]["embedding"])
    theirs = golden_vectors(rows[0])
    assert vectors.shape == theirs.shape == (len(rows[0]["tokens"]), 576)
    assert min(cosine(a, b) for a, b in zip(vectors, theirs, strict=True)) >= 0.997  # not normalised
    r = post(none_server, "/v1/embeddings", {"input": "hello"})
    assert (
        r.status_code == 400 and "Pooling type 'none' is not OAI compatible" in r.json()["error"]["message"]
    )


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"input": 5}, "input"),
        ({"input": [1.5]}, "input"),
        ({"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ({"input": "x", "embd_normalize": "2"}, "embd_normalize"),
        ({"input": "x", "embd_normalize": -2}, "embd_normalize"),
        ({"input": "x", "dimensions": 0}, "dimensions"),
        ({"model": "x"}, '"input" or "content"'),
        ({"input": ""}, "Input content cannot be empty"),
        ({"input": [[99999999]]}, "outside the vocabulary"),
        ({"input": "word " * 1100}, "exceeds the available context"),
    ],
)
def test_bad_embedding_input_is_400_naming_it(mean_server: ServerProcess, body: dict, field: str) -> None:
    r = post(mean_server, "/v1/embeddings", body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"] and r.json()["error"]["type"].endswith("_error")


def test_content_parts_embed_as_their_joined_text(mean_server: ServerProcess) -> None:
    parts = {"content": [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}
    plain, joined = embeddings(mean_server, ["hello world", parts])
    assert plain == joined
    assert embeddings(mean_server, parts) == [plain]  # one content object is one input


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"content": "string"}, "input"),
        ({"content": [{"type": "unknown"}]}, '{"type": "text", "text": "..."}'),
        (
            {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]},
            "image input is not supported",
        ),
        (
            {"content": [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}]},
            "audio input is not supported",
        ),
    ],
)
def test_bad_content_parts_are_400(mean_server: ServerProcess, value: dict, field: str) -> None:
    r = post(mean_server, "/v1/embeddings", {"input": [value]})
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


def test_without_the_flag_the_routes_answer_501(server: ServerProcess) -> None:
    for path, body in (("/v1/embeddings", {"input": "x"}), ("/rerank", {"query": "q", "documents": ["d"]})):
        r = post(server, path, body)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert "--embeddings" in r.json()["error"]["message"] or "--reranking" in r.json()["error"]["message"]


def test_rerank_orders_documents_as_llama_cpp(rerank_server: ServerProcess) -> None:
    golden = GOLDEN["rerank"]
    docs = [d["document"] for d in golden["documents"]]
    body = post(rerank_server, "/v1/rerank", {"query": golden["query"], "documents": docs}).json()
    expected = sorted(range(len(docs)), key=lambda i: -golden["documents"][i]["score"])
    assert [r["index"] for r in body["results"]] == expected
    for result in body["results"]:
        assert abs(result["relevance_score"] - golden["documents"][result["index"]]["score"]) < 2e-3
    assert body["usage"]["prompt_tokens"] == sum(len(d["tokens"]) for d in golden["documents"])
    top = post(rerank_server, "/rerank", {"query": golden["query"], "documents": docs, "top_n": 2}).json()
    assert [r["index"] for r in top["results"]] == expected[:2]
    tei = post(
        rerank_server, "/reranking", {"query": golden["query"], "texts": docs, "return_text": True}
    ).json()
    assert [r["index"] for r in tei] == expected and tei[0]["text"] == docs[expected[0]] and "score" in tei[0]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"documents": ["a"]}, "query"),
        ({"query": 1, "documents": ["a"]}, "query"),
        ({"query": "q", "documents": []}, "documents"),
        ({"query": "q", "documents": ["a", 2]}, "documents"),
        ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
        ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
        ({"query": "q", "documents": ["a"], "return_documents": True}, "return_documents"),
    ],
)
def test_bad_rerank_input_is_400_naming_it(rerank_server: ServerProcess, body: dict, field: str) -> None:
    r = post(rerank_server, "/v1/reranking", body)
    assert r.status_code == 400 and field in r.json()["error"]["message"], r.text


# What the real llama-server (0c1e570) answers for SmolLM2 Q4_1 started with --reranking: it has no
# classifier head, so each score is the first component of the last token's normed state.
HEADLESS_QUERY = "Machine learning is"
HEADLESS_DOCS = ["A machine is a physical system", "Learning is the process", "Paris, capitale de la France"]
HEADLESS_SCORES = {0: 0.0618, 2: -0.4730, 1: -1.5281}


def test_reranking_a_model_without_a_head_serves_as_llama_server() -> None:
    proc = ServerProcess("-m", "smollm2", "--reranking", "-np", "1", "-c", "512")
    try:
        proc.wait_healthy()
        body = post(proc, "/rerank", {"query": HEADLESS_QUERY, "documents": HEADLESS_DOCS}).json()
        assert [r["index"] for r in body["results"]] == list(HEADLESS_SCORES)
        for result in body["results"]:
            # Q4_1 activations are quantised differently from llama.cpp's: same ranks, nearby values
            assert abs(result["relevance_score"] - HEADLESS_SCORES[result["index"]]) < 0.1
        assert body["usage"]["prompt_tokens"] == 26  # llama-server's count for the same prompts
        tei = post(proc, "/rerank", {"query": HEADLESS_QUERY, "texts": HEADLESS_DOCS, "top_n": 2}).json()
        assert [r["index"] for r in tei] == [0, 2]
    finally:
        proc.stop()


def test_embeddings_and_generation_share_batches_unchanged(mean_server: ServerProcess) -> None:
    completion = {"prompt": "The history of the sea", "max_tokens": 48, "temperature": 0}
    alone_text = post(mean_server, "/v1/completions", completion).json()["choices"][0]["text"]
    alone = embeddings(mean_server, TEXTS[:8])
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        text = pool.submit(lambda: post(mean_server, "/v1/completions", completion).json())
        vectors = [pool.submit(embeddings, mean_server, TEXTS[:8]) for _ in range(2)]
        assert text.result()["choices"][0]["text"] == alone_text
        assert [v.result() for v in vectors] == [alone, alone]


def test_flags() -> None:
    from server.config.parse import parse_settings

    settings, _ = parse_settings(["--reranking"])
    assert settings.embedding and settings.pooling == "rank"
    settings, _ = parse_settings(["--embeddings", "--pooling", "last", "--embd-normalize", "0"])
    assert (settings.embedding, settings.pooling, settings.embd_normalize) == (True, "last", 0)
    for bad in (["--pooling", "max"], ["--embd-normalize", "-2"]):
        with pytest.raises(SystemExit) as exc:
            parse_settings(bad)
        assert exc.value.code == 2
