"""The models against llama.cpp's own outputs (tests/golden), and batching that changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from cli.perplexity import perplexity
from engine.batch import Batch, BatchPart
from engine.llm import LLM
from engine.memory.kv import DEFAULT_CACHE_TYPES, CacheTypes
from engine.memory.kv_types import Q8_0
from tests.conftest import gpl3_text, load_golden


def llama_cpp_ppl(name: str) -> float:
    """llama.cpp's perplexity on GPL-3 (-c 512, 8 chunks) from the model's golden file (tests/golden/README.md
    gives the command that measured it)."""
    return float(load_golden(name)["perplexity"]["ppl"])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def teacher_forced_agreement(
    llm: LLM, golden: dict, types: CacheTypes = DEFAULT_CACHE_TYPES
) -> tuple[float, float, int]:
    """(top-token agreement rate, median |delta logprob| of llama.cpp's token, confident mismatches);
    `types`: the KV cache's cell types."""
    agree, gaps, confident_misses = [], [], 0
    for case in golden["greedy"]:
        prompt, tokens = case["prompt_tokens"], case["tokens"]
        kv = llm.new_cache(1, len(prompt) + len(tokens), types)
        logits = llm.model.forward(Batch.of([BatchPart(0, 0, prompt + tokens, "all")]), kv)
        lp = log_softmax(logits[len(prompt) - 1 : -1])
        for i, token in enumerate(tokens):
            top = case["top_logprobs"][i]
            mine = int(lp[i].argmax())
            agree.append(mine == top[0]["id"])
            gaps.append(abs(lp[i, token] - case["logprob"][i]))
            if top[0]["logprob"] - top[1]["logprob"] >= 0.5 and mine != top[0]["id"]:
                confident_misses += 1
    return float(np.mean(agree)), float(np.median(gaps)), confident_misses


# How often the top token may differ from the golden's (llama.cpp's AVX-512 build) where its top two are
# under 0.5 apart. llama.cpp's own AVX2 build (0c1e570, native on an AMD znver3) agrees with it at 175 of
# SmolLM2's 181 positions (96.7%; median |delta logprob| 0.017, max 0.17); Llamba at avx2 175, at the
# portable level (no FMA, which no llama.cpp build measured here lacks) 171 (94.5%).
AGREEMENT = 0.94


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_teacher_forced_numerics_match_llama_cpp(name: str, request: pytest.FixtureRequest) -> None:
    llm = request.getfixturevalue(f"{name}_llm")
    rate, median_gap, confident_misses = teacher_forced_agreement(llm, load_golden(name))
    assert rate >= AGREEMENT, f"top token agrees with llama.cpp at only {rate:.1%} of positions"
    assert confident_misses == 0, "disagrees where llama.cpp's top two are >= 0.5 apart"
    assert median_gap <= 0.03, f"median |delta logprob| {median_gap:.4f}"


Q8_0_CACHE = CacheTypes(Q8_0, Q8_0)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_q8_0_kv_cache_keeps_the_fidelity_bars(name: str, request: pytest.FixtureRequest) -> None:
    """-ctk q8_0 -ctv q8_0 against llama.cpp's (f16-cache) goldens: the bars the f16 cache meets, but one
    confident miss: on Gemma 3's sixth case, eighth token, the golden puts 236778 0.66 above 236812, and
    llama.cpp's own AVX2 build with -ctk q8_0 -ctv q8_0 (flash attention on, as it needs) puts 236812 0.27
    above 236778, as Llamba at avx2 does (0.19)."""
    llm = request.getfixturevalue(f"{name}_llm")
    rate, median_gap, confident_misses = teacher_forced_agreement(llm, load_golden(name), Q8_0_CACHE)
    assert rate >= AGREEMENT, f"top token agrees with llama.cpp at only {rate:.1%} of positions"
    assert confident_misses <= 1, "disagrees where llama.cpp's top two are >= 0.5 apart"
    assert median_gap <= 0.03, f"median |delta logprob| {median_gap:.4f}"
    tokens = llm.tokenizer.encode(gpl3_text(), add_special=True, parse_special=False)
    *_, final = perplexity(llm, tokens, n_ctx=512, n_chunks=8, types=Q8_0_CACHE)
    expected = llama_cpp_ppl(name)
    assert abs(final.ppl - expected) / expected <= 0.015, f"PPL {final.ppl:.4f} vs llama.cpp {expected}"


# How far below Llamba's own pick llama.cpp's token may be where a greedy decode parts from llama.cpp's
# (nats): a near tie, which the rounding of one build or another decides. On SmolLM2's sixth token
# llama.cpp's own builds part by 0.24: its AVX-512 build (the golden) puts 1797 0.26 above 2988, its AVX2
# build (native on an AMD znver3) 0.017 above; Llamba at avx2 there puts 2988 0.115 above 1797. The
# portable level parts from llama.cpp on Gemma 3's sixth token by 0.014.
NEAR_TIE = 0.25


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_greedy_generation_matches_golden_prefix(name: str, request: pytest.FixtureRequest) -> None:
    """Free-running greedy decode reproduces llama.cpp's first tokens, or parts from them at a near-tie
    only (the same prefix fed, llama.cpp's token within NEAR_TIE of Llamba's)."""
    llm = request.getfixturevalue(f"{name}_llm")
    case = load_golden(name)["greedy"][0]
    (out,) = llm.generate_greedy([case["prompt_tokens"]], 8)
    want = case["tokens"][:8]
    if out != want:
        i = next(i for i, (a, b) in enumerate(zip(out, want, strict=True)) if a != b)
        tokens = case["prompt_tokens"] + want[:i]
        logits = llm.model.run(Batch.of([BatchPart(0, 0, tokens, "last")]), llm.new_cache(1, 256)).logits[-1]
        assert logits[out[i]] - logits[want[i]] <= NEAR_TIE, (i, out, want)


def decode_in_shared_batches(
    llm: LLM, prompts: list[list[int]], steps: int, joins: list[int]
) -> list[list[np.ndarray]]:
    """Each sequence's logits rows (its prompt's last, then one per greedy token) when sequence s joins
    the shared batch at step joins[s]: from then on, batches mix prefills with other sequences' decodes."""
    kv = llm.new_cache(len(prompts), 128)
    rows: list[list[np.ndarray]] = [[] for _ in prompts]
    next_token: dict[int, int] = {}
    for step in range(max(joins) + steps + 1):
        parts = []
        for s, prompt in enumerate(prompts):
            if joins[s] == step:
                parts.append(BatchPart(s, 0, prompt))
            elif joins[s] < step <= joins[s] + steps:
                parts.append(BatchPart(s, int(kv.lengths[s]), [next_token[s]]))
        logits = llm.model.forward(Batch.of(parts), kv)
        for part, row in zip(parts, logits, strict=True):
            rows[part.seq_id].append(row)
            next_token[part.seq_id] = int(np.argmax(row))
    return rows


def decode_alone(llm: LLM, prompt: list[int], steps: int) -> list[np.ndarray]:
    kv = llm.new_cache(1, 128)
    tokens, rows = list(prompt), []
    for _ in range(steps + 1):
        start = int(kv.lengths[0])
        rows.append(llm.model.forward(Batch.of([BatchPart(0, start, tokens[start:])]), kv)[0])
        tokens.append(int(np.argmax(rows[-1])))
    return rows


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_batched_decode_equals_separate_runs(name: str, request: pytest.FixtureRequest) -> None:
    """8 sequences of different lengths decoded in shared batches give the logits of 8 separate runs, bit
    for bit: a token's logits do not depend on what else is in its batch (other sequences, prefills)."""
    llm = request.getfixturevalue(f"{name}_llm")
    prompts = [llm.tokenizer.encode(f"Story {i}: " + "once upon a time " * (i + 1)) for i in range(8)]
    steps = 4
    batched = decode_in_shared_batches(llm, prompts, steps, joins=[0, 0, 0, 1, 1, 2, 3, 3])
    for s, prompt in enumerate(prompts):
        for step, row in enumerate(decode_alone(llm, prompt, steps)):
            np.testing.assert_array_equal(row, batched[s][step], err_msg=f"sequence {s}, step {step}")


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_perplexity_within_1_5_percent_of_llama_cpp(name: str, request: pytest.FixtureRequest) -> None:
    llm = request.getfixturevalue(f"{name}_llm")
    tokens = llm.tokenizer.encode(gpl3_text(), add_special=True, parse_special=False)
    *_, final = perplexity(llm, tokens, n_ctx=512, n_chunks=8)
    assert final.n_chunks == 8
    expected = llama_cpp_ppl(name)
    assert abs(final.ppl - expected) / expected <= 0.015, f"PPL {final.ppl:.4f} vs llama.cpp {expected}"
