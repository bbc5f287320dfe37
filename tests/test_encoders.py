"""Encoders (BERT and kin) against llama.cpp's outputs on the same files (tests/golden/encoders.json, made by
scripts/make_encoder_goldens.py with llama-cpp-python 0.3.36).

The two real files (all-MiniLM-L6-v2 Q8_0, nomic-embed-text-v1.5 F16): the 100 sentences of
scripts/encoder_sentences.py tokenize to llama.cpp's ids exactly, and each pooled vector is within BARS
of llama.cpp's (and MiniLM's as accurate as llama.cpp's against the exact answer). The synthetic
families (tests/synthetic_encoders.py: a bge-style BERT reranker, jina-bert-v2, ModernBERT,
EmbeddingGemma; Qwen3 as an embedder and reranker, tests/synthetic_reranker.py) in every pooling, per
token too, and their rerank scores and order.
WordPiece itself is checked on llama.cpp's own cases in tests/test_wordpiece.py.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest

from engine.batch import Batch, BatchPart
from engine.llm import LLM
from engine.model_files import MINILM, NOMIC_EMBED, models_dir, resolve
from tests.conftest import load_golden, require
from tests.synthetic_encoders import FAMILIES, vocabularies, write_encoder
from tests.synthetic_reranker import write_reranker

GOLDEN = load_golden("encoders")
REAL = {MINILM.name: MINILM, NOMIC_EMBED.name: NOMIC_EMBED}
# Cosine with llama.cpp's vector, every one of the 100. nomic-embed (F16) meets the 0.9999 by far
# (measured 0.9999995; with float weights MiniLM too: 0.9999996). MiniLM Q8_0 does not, and cannot
# without reproducing ggml's SIMD sums bit for bit: both engines round each matmul's input to int8, so a
# last-bit difference anywhere flips roundings that six layers amplify. Measured (avx512-vnni, 2026-12-06):
# min 0.99984, median 0.99994, 9 of 100 below 0.9999. llama.cpp against itself, flash attention on (what
# llama-server runs) vs off (these goldens): min 0.99902, median 0.99989, 63 below 0.9999. What Llamba
# must keep is accuracy: its distance from the exact answer (llama.cpp on the dequantized file) equals
# llama.cpp's own (median 2.24e-4 vs 2.26e-4, max 1.808e-3 both; ERROR_RATIO checks it per vector).
BARS = {MINILM.filename: 0.9998, NOMIC_EMBED.filename: 0.9999}
ERROR_RATIO, ERROR_SLACK = 1.5, 1e-4  # measured worst: ratio 1.32, excess 8.7e-5
# Synthetic files are float32 or Q8_0 and tiny (64 wide): their vectors agree to float rounding, except
# EmbeddingGemma's pooled ones, which its Q8_0 projections (dense_2, dense_3) take after a mean or a row
# that differs from llama.cpp's in the last bits (measured 1 - cos up to 4.6e-5; per token 1.2e-7).
SYNTHETIC_BAR = 0.99999
DENSE_BAR = 0.9999


def vectors(row: dict, key: str = "embedding", dtype: str = "<f4") -> np.ndarray:
    return np.frombuffer(base64.b64decode(row[key]), dtype=dtype).astype(np.float32).reshape(row["shape"])


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def hidden_states(llm: LLM, prompts: list[list[int]]) -> list[np.ndarray]:
    """Each prompt's final hidden states, all of them packed into one forward pass (a decoder's too, each
    prompt in its own KV sequence)."""
    parts = [BatchPart(i, 0, tokens, "none", want_hidden=True) for i, tokens in enumerate(prompts)]
    out = llm.model.run(Batch.of(parts), llm.new_cache(len(prompts), 512)).hidden
    bounds = np.cumsum([0, *map(len, prompts)])
    return [out[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def real_model(name: str) -> LLM:
    spec = REAL[name]
    if not (models_dir() / spec.filename).is_file():
        require(f"{spec.filename} is not in {models_dir()} (`make models` fetches it)")
    return LLM.load(name)


@pytest.fixture(scope="module", params=sorted(REAL))
def real(request: pytest.FixtureRequest) -> tuple[LLM, dict]:
    llm = real_model(request.param)
    case = GOLDEN["real"][request.param]
    assert hashlib.sha256(llm.path.read_bytes()).hexdigest() == case["sha256"] == REAL[request.param].sha256
    return llm, case


def test_real_files_tokenize_the_sentences_as_llama_cpp(real: tuple[LLM, dict]) -> None:
    llm, case = real
    for text, tokens in zip(GOLDEN["sentences"], case["tokens"], strict=True):
        assert llm.tokenizer.encode(text, True, True) == tokens, text


def test_real_files_embed_every_sentence_as_llama_cpp(real: tuple[LLM, dict]) -> None:
    llm, case = real
    theirs = vectors(case, "vectors", "<f2")
    pooler = llm.model.pooler
    for start in range(0, len(case["tokens"]), 10):  # ten inputs a pass, as the server packs them
        prompts = case["tokens"][start : start + 10]
        for i, states in enumerate(hidden_states(llm, prompts)):
            sim = cosine(pooler(states, case["pooling"]), theirs[start + i])
            assert sim >= BARS[case["file"]], (GOLDEN["sentences"][start + i], sim)


def test_minilm_is_as_accurate_as_llama_cpp() -> None:
    """Against the exact answer (llama.cpp's vectors of the dequantized file: float weights, no int8
    activations), Llamba's Q8_0 vectors err no more than llama.cpp's own."""
    llm, case = real_model(MINILM.name), GOLDEN["real"][MINILM.name]
    theirs = vectors(case, "vectors", "<f2")
    exact = vectors({"shape": case["shape"], "v": case["float_vectors"]}, "v", "<f2")
    for start in range(0, len(case["tokens"]), 10):
        for i, states in enumerate(hidden_states(llm, case["tokens"][start : start + 10]), start):
            ours = llm.model.pooler(states, "mean")
            our_error, their_error = 1 - cosine(ours, exact[i]), 1 - cosine(theirs[i], exact[i])
            assert our_error <= ERROR_RATIO * their_error + ERROR_SLACK, (GOLDEN["sentences"][i], our_error)


def test_packing_does_not_change_a_vector(real: tuple[LLM, dict]) -> None:
    """An input's states are bitwise the same alone or packed with others into one pass."""
    llm, case = real
    prompts = case["tokens"][40:46]
    together = hidden_states(llm, prompts)
    for prompt, packed in zip(prompts, together, strict=True):
        assert np.array_equal(hidden_states(llm, [prompt])[0], packed)


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("encoders")
    for name in FAMILIES:
        write_encoder(name, folder / f"{name}.gguf", vocabularies())
    write_reranker(folder / "qwen3-reranker.gguf", resolve("smollm2"))
    return folder


@pytest.fixture(scope="module", params=sorted(GOLDEN["synthetic"]))
def synthetic(request: pytest.FixtureRequest, synthetic_dir: Path) -> tuple[LLM, dict]:
    case = GOLDEN["synthetic"][request.param]
    path = synthetic_dir / case["file"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == case["sha256"]
    return LLM.load(str(path)), case


def test_synthetic_families_in_every_pooling(synthetic: tuple[LLM, dict]) -> None:
    llm, case = synthetic
    for pooling, rows in case["poolings"].items():
        for row in rows:
            assert llm.tokenizer.encode(row["text"], True, True) == row["tokens"], row["text"]
            (states,) = hidden_states(llm, [row["tokens"]])
            ours, theirs = llm.model.pooler(states, pooling), vectors(row)
            pairs = zip(ours, theirs, strict=True) if pooling == "none" else [(ours, theirs)]
            sim = min(cosine(a, b) for a, b in pairs)
            bar = DENSE_BAR if llm.model.pooler.dense is not None and pooling != "none" else SYNTHETIC_BAR
            assert sim >= bar, (pooling, row["text"], sim)


def test_synthetic_rerank_scores_and_order(synthetic: tuple[LLM, dict]) -> None:
    llm, case = synthetic
    rerank = case["rerank"]  # a family without a classifier scores with its pooled state's first float
    ours, theirs = [], []
    for doc in rerank["documents"]:
        (states,) = hidden_states(llm, [doc["tokens"]])
        ours.append(float(llm.model.pooler(states, "rank")[0]))
        theirs.append(doc["scores"][0])
    assert np.argsort(ours).tolist() == np.argsort(theirs).tolist()
    np.testing.assert_allclose(ours, theirs, atol=2e-4)
