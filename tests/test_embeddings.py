"""Embeddings and rerank scores against llama.cpp's (tests/golden/embeddings.json), on the model itself.

The vectors are the final hidden states (after the output norm) that the model returns for a batch
part with `want_hidden`, pooled by engine/embedding.py; llama.cpp's are llama-cpp-python's for the same
tokens (scripts/make_embedding_goldens.py). The server routes are in tests/test_embeddings_server.py.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest

from engine.batch import Batch, BatchPart
from engine.embedding import RankHead, pool
from engine.llm import LLM
from engine.model_files import resolve
from tests.conftest import load_golden
from tests.synthetic_reranker import write_reranker

GOLDEN = load_golden("embeddings")

# Cosine similarity with llama.cpp's vectors. Pooled vectors of SmolLM2 and Gemma 3's first token reach
# 0.999; Gemma 3's last-token and mean vectors are 0.9957-0.9997 and single tokens' states (pooling
# none) 0.9901-0.9999, re-measured since the activations are rounded as llama.cpp's (Q8_K for the
# K-quants). With dequantized weights the two agree to 0.999999: docs/numerics.md, Embeddings.
BARS = {
    ("smollm2", "none"): 0.997,
    ("smollm2", "mean"): 0.999,
    ("smollm2", "cls"): 0.999,
    ("smollm2", "last"): 0.999,
    ("gemma3", "none"): 0.99,
    ("gemma3", "mean"): 0.995,
    ("gemma3", "cls"): 0.999,
    ("gemma3", "last"): 0.995,
}


def golden_vectors(row: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4").reshape(row["shape"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def hidden_states(llm: LLM, tokens: list[int]) -> np.ndarray:
    out = llm.model.run(Batch.of([BatchPart(0, 0, tokens, "none", want_hidden=True)]), llm.new_cache(1, 512))
    assert out.logits.shape[0] == 0  # hidden states instead of logits
    return out.hidden


@pytest.mark.parametrize("model", ["smollm2", "gemma3"])
def test_pooled_embeddings_match_llama_cpp(model: str, request: pytest.FixtureRequest) -> None:
    llm = request.getfixturevalue(f"{model}_llm")
    for pooling, rows in GOLDEN["models"][model]["poolings"].items():
        for row in rows:
            assert llm.tokenizer.encode(row["text"], True, True) == row["tokens"]
            ours, theirs = pool(hidden_states(llm, row["tokens"]), pooling), golden_vectors(row)
            assert ours.shape == theirs.shape
            if pooling == "none":  # every token's vector
                similarity = min(cosine(a, b) for a, b in zip(ours, theirs, strict=True))
            else:
                similarity = cosine(ours, theirs)
            assert similarity >= BARS[model, pooling], (pooling, row["text"], similarity)


@pytest.fixture(scope="module")
def reranker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = write_reranker(tmp_path_factory.mktemp("reranker") / "reranker.gguf", resolve("smollm2"))
    assert hashlib.sha256(path.read_bytes()).hexdigest() == GOLDEN["rerank"]["sha256"]
    return path


def test_rank_pooling_scores_as_llama_cpp(reranker: Path) -> None:
    llm = LLM.load(str(reranker))
    head = llm.model.rank_head
    assert isinstance(head, RankHead) and head.n_out == GOLDEN["rerank"]["n_cls_out"] == 2
    docs = GOLDEN["rerank"]["documents"]
    ours = [float(pool(hidden_states(llm, d["tokens"]), "rank", head)[0]) for d in docs]
    theirs = [d["score"] for d in docs]
    assert np.argsort(ours).tolist() == np.argsort(theirs).tolist()
    np.testing.assert_allclose(ours, theirs, atol=2e-3)


def test_rank_pooling_needs_a_classifier_head() -> None:
    with pytest.raises(ValueError, match="classifier head"):
        pool(np.ones((3, 4), np.float32), "rank", None)
